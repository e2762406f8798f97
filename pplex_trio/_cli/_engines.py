"""Choosing the engine behind ``--model``: the echo test engine or a PersonaPlex/Moshi model.

The echo engine takes its options in the model name: ``echo``, or
``echo:delay=2,step_ms=20`` (:class:`EchoOptions`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any, TypedDict

from .._precision import Precision
from .._setting import bounds_problem, setting
from .._sources import DEFAULT_REPO
from ..engine import OFF_GPU_SLOTS, EchoEngine, Engine, voices_in_directory
from ..server import ServerSettings

logger = logging.getLogger(__name__)


class _EchoVoices(TypedDict, total=False):
    voices: Sequence[str]  # given: the voices of --voice-dir; not: EchoEngine's default


class ModelUnavailable(Exception):
    """The requested model cannot be served here; the message says why and what to do."""


ECHO = "echo"


@dataclasses.dataclass(frozen=True)
class EchoOptions:
    """The echo test engine's options, given after its name: ``--model echo:delay=2,step_ms=20``."""

    delay: int = setting(1, "output delay, in 80 ms frames", low=0)
    prompt: int = setting(12, "system-prompt positions each conversation runs before it is live", low=0)
    step_ms: float = setting(
        0.0, "sleep per step, standing in for GPU time (and a fiftieth of it per system-prompt position)", low=0
    )
    text_share: float = setting(
        1.0, "the share of frames with a text piece (the frame number); a speaking model gives about 0.3", low=0, high=1
    )

    @classmethod
    def from_model(cls, model: str) -> EchoOptions | None:
        """The options of ``echo`` or ``echo:NAME=VALUE,...``; None for any other model.

        Error handling: ``ValueError`` with one line naming the option and what is wrong with it (an
        unknown name, a missing or bad value, one given twice, out of bounds), and listing the options.
        """
        name, colon, given = model.partition(":")
        if name != ECHO:
            return None
        fields = {field.name: field for field in dataclasses.fields(cls)}
        values: dict[str, Any] = {}

        def refuse(problem: str) -> ValueError:
            known = ", ".join(f"{option}={field.default:g}" for option, field in fields.items())
            return ValueError(f"--model {model}: {problem} (the echo engine's options and their defaults: {known})")

        for item in given.split(",") if colon else ():
            key, equals, text = (part.strip() for part in item.partition("="))
            field = fields.get(key)
            if field is None:
                raise refuse(f"unknown option {key!r}" if key else "an empty option")
            if not equals or not text:
                raise refuse(f"{key} needs a value, as in {key}={field.default:g}")
            if key in values:
                raise refuse(f"{key} is given twice")
            kind = int if isinstance(field.default, int) else float
            try:
                value = kind(text)
            except ValueError:
                raise refuse(f"{key} must be {'a whole number' if kind is int else 'a number'}, not {text!r}") from None
            problem = bounds_problem(field, value) or (None if math.isfinite(value) else f"must be finite, got {text}")
            if problem is not None:
                raise refuse(f"{key} {problem}")
            values[key] = value
        return cls(**values)


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (torch imported only here, when asked)."""
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
    logger.info(
        "--model auto: no GPU here, serving the tiny random-weight model on the CPU (its voice is noise); "
        "pass --model %s to load the real one anyway",
        DEFAULT_REPO,
    )
    return "tiny"


TRANSCRIBE_OFF = "off"
TRANSCRIBE_AUTO = "auto"
TRANSCRIBE_TINY = "tiny"


def resolve_transcriber(transcribe: str, model: str, device: str) -> tuple[str | None, bool]:
    """What ``--transcribe`` loads beside ``model`` (resolved) on ``device`` (resolved): ``(source, required)``.

    ``off``: nothing; ``tiny``: the random-weight ``tiny-stt``; a repo id or a folder: that, required (a failure
    stops the server); ``auto``: Kyutai's 1B model beside the real model on a GPU, not required (the engine
    leaves it out, with a warning, when it does not fit or load), else nothing, and one log line says why.
    """
    from .._sources import STT_DEFAULT_REPO

    if transcribe == TRANSCRIBE_OFF:
        return None, False
    if transcribe == TRANSCRIBE_TINY:
        return "tiny-stt", True
    if transcribe != TRANSCRIBE_AUTO:
        return transcribe, True
    if EchoOptions.from_model(model) is not None or model == "tiny" or not device.startswith("cuda"):
        why = "the echo engine" if model.startswith(ECHO) else "the tiny model" if model == "tiny" else "no GPU"
        logger.info(
            "--transcribe auto: off (%s); pass --transcribe tiny or --transcribe %s to hear the caller in words",
            why,
            STT_DEFAULT_REPO,
        )
        return None, False
    logger.info("--transcribe auto: %s beside %s, if the GPU has room for it", STT_DEFAULT_REPO, model)
    return STT_DEFAULT_REPO, False


def create_engine(settings: ServerSettings) -> Engine:
    """``echo`` (with its options) is the test engine, only when asked for by name; anything else is a model.

    Error handling: ``ValueError`` for a bad echo option; :class:`ModelUnavailable` for a model that cannot be
    served here.
    """
    model = resolve_model(settings.model)
    device = resolve_device(settings.device)
    transcribe, required = resolve_transcriber(settings.transcribe, model, device)
    echo = EchoOptions.from_model(model)
    if echo is not None and transcribe is not None:
        raise ModelUnavailable(
            f"--transcribe {settings.transcribe}: the echo test engine has no transcriber; use --transcribe off"
        )
    if echo is not None:
        kwargs: _EchoVoices = {}
        if settings.voice_dir is not None:
            kwargs["voices"] = voices_in_directory(settings.voice_dir)
        return EchoEngine(
            settings.slots or OFF_GPU_SLOTS,
            delay_frames=echo.delay,
            prefill_steps=echo.prompt,
            step_seconds=echo.step_ms / 1000,
            prefill_seconds=echo.step_ms / 1000 / 50,  # a 100-position prompt: two ticks' compute
            text_share=echo.text_share,
            **kwargs,
        )
    try:
        from ..engine import PersonaPlexEngine
    except ImportError as exc:
        raise ModelUnavailable(
            f"--model {model}: the PersonaPlex engine is not available in this build ({exc}); use --model echo"
        ) from exc
    from ..engine import TranscriberUnavailable
    from ..model import CheckpointMismatchError, ModelAccessError, VoiceNotFoundError

    try:
        return PersonaPlexEngine.load(
            model,
            num_slots=settings.slots,
            device=device,
            voice_dir=None if settings.voice_dir is None else str(settings.voice_dir),
            cuda_graph=settings.cuda_graph.engine_argument,
            compile=settings.compile,
            memory_reserve=settings.gpu_memory_reserve,
            precision=Precision(settings.quantize, settings.kv_cache),
            transcribe=transcribe,
            transcribe_required=required,
        )
    except TranscriberUnavailable as exc:
        raise ModelUnavailable(str(exc)) from exc
    except (ModelAccessError, CheckpointMismatchError, VoiceNotFoundError, ValueError) as exc:
        raise ModelUnavailable(f"--model {model}: {exc}") from exc
