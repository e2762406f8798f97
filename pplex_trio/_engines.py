"""Choosing the engine behind ``--model``."""

from __future__ import annotations

from .engine import EchoEngine, Engine, voices_in_directory
from .server import ServerSettings


class ModelUnavailable(Exception):
    """The requested model cannot be served here; the message says why and what to do."""


def resolve_device(device: str) -> str:
    """``auto`` means the first GPU when torch sees one, else the CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def create_engine(settings: ServerSettings) -> Engine:
    """``echo`` is the test engine; anything else is a PersonaPlex/Moshi model."""
    if settings.model == "echo":
        kwargs = {}
        if settings.voice_dir is not None:
            kwargs["voices"] = voices_in_directory(settings.voice_dir)
        return EchoEngine(
            settings.slots,
            delay_frames=settings.echo_delay_frames,
            prefill_steps=settings.echo_prefill_steps,
            step_seconds=settings.echo_step_seconds,
            **kwargs,
        )
    try:
        from .engine._personaplex import PersonaPlexEngine
    except ImportError as exc:
        raise ModelUnavailable(
            f"--model {settings.model}: the PersonaPlex engine is not available in this build ({exc}); "
            "use --model echo"
        ) from exc
    from .model import CheckpointMismatchError, ModelAccessError, VoiceNotFoundError

    try:
        return PersonaPlexEngine.load(
            settings.model,
            num_slots=settings.slots,
            device=resolve_device(settings.device),
            voice_dir=None if settings.voice_dir is None else str(settings.voice_dir),
            cuda_graph=settings.cuda_graph,
        )
    except (ModelAccessError, CheckpointMismatchError, VoiceNotFoundError, ValueError) as exc:
        raise ModelUnavailable(f"--model {settings.model}: {exc}") from exc
