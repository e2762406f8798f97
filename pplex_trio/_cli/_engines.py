"""Choosing the engine behind ``--model``: the echo test engine or a PersonaPlex/Moshi model."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypedDict

from .._precision import Precision
from .._sources import DEFAULT_REPO
from ..engine import OFF_GPU_SLOTS, EchoEngine, Engine, voices_in_directory
from ..server import ServerSettings

logger = logging.getLogger(__name__)


class _EchoOptions(TypedDict, total=False):
    voices: Sequence[str]  # given: the voices of --voice-dir; not: EchoEngine's default


class ModelUnavailable(Exception):
    """The requested model cannot be served here; the message says why and what to do."""


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_device(device: str) -> str:
    """``auto`` means the first GPU when torch sees one, else the CPU."""
    if device != "auto":
        return device
    return "cuda" if cuda_available() else "cpu"


def resolve_model(model: str) -> str:
    """``auto``: the real model when torch sees a GPU, else the tiny CPU model (and say so)."""
    if model != "auto":
        return model
    if cuda_available():
        logger.info("--model auto: a GPU is here, serving %s", DEFAULT_REPO)
        return DEFAULT_REPO
    logger.info("--model auto: no GPU here, serving the tiny random-weight model on the CPU (its voice is noise); "
                "pass --model %s to load the real one anyway", DEFAULT_REPO)
    return "tiny"


def create_engine(settings: ServerSettings) -> Engine:
    """``echo`` is the test engine (only when asked for by name); anything else is a model."""
    model = resolve_model(settings.model)
    if model == "echo":
        kwargs: _EchoOptions = {}
        if settings.voice_dir is not None:
            kwargs["voices"] = voices_in_directory(settings.voice_dir)
        return EchoEngine(
            settings.slots or OFF_GPU_SLOTS,
            delay_frames=settings.echo_delay_frames,
            prefill_steps=settings.echo_prefill_steps,
            step_seconds=settings.echo_step_ms / 1000,
            prefill_seconds=settings.echo_step_ms / 1000 / 50,  # a 100-position prompt: two ticks' compute
            text_share=settings.echo_text_share,
            **kwargs,
        )
    try:
        from ..engine import PersonaPlexEngine
    except ImportError as exc:
        raise ModelUnavailable(
            f"--model {model}: the PersonaPlex engine is not available in this build ({exc}); use --model echo"
        ) from exc
    from ..model import CheckpointMismatchError, ModelAccessError, VoiceNotFoundError

    try:
        return PersonaPlexEngine.load(
            model,
            num_slots=settings.slots,
            device=resolve_device(settings.device),
            voice_dir=None if settings.voice_dir is None else str(settings.voice_dir),
            cuda_graph=settings.cuda_graph,
            memory_reserve=settings.gpu_memory_reserve,
            precision=Precision(settings.quantize, settings.kv_cache),
        )
    except (ModelAccessError, CheckpointMismatchError, VoiceNotFoundError, ValueError) as exc:
        raise ModelUnavailable(f"--model {model}: {exc}") from exc
