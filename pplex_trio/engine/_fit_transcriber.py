"""The memory of a transcriber beside the model, from its config: what ``fit`` and ``--slots auto`` add.

As for the conversation model (:mod:`~pplex_trio.engine._fit`), nothing is a
constant: the transcriber and its per-row state are built on ``meta`` and
measured, so the figures are the bytes the engine allocates:

* **weights**: its parameters (the LM in its dtype); its own Mimi is not kept
  (the engine's encode serves it);
* **per conversation**: one more row's KV rings (layers × context × dim × 2
  for keys and values, in the LM's dtype), token cache and codes, plus the
  peak of one step's temporaries for one more row.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ..model import (
    LoadedModel,
    LoadedTranscriber,
    ModelAccessError,
    SpeechToText,
    STTConfig,
    Transcriber,
    lm_dtype_for,
    load_stt_config,
)
from ._fit import GIB, SPAN, _bytes, _tensors, free_device_memory, peak_bytes, plan_memory
from ._transcribing import TranscriberUnavailable, load_for_engine

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TranscriberPlan:
    """Bytes of a transcriber on the device: its weights and what each conversation adds."""

    model: str
    weights: int
    per_conversation: int

    def as_dict(self) -> dict[str, object]:
        """In GiB, for ``fit``'s JSON."""
        return {
            "model": self.model,
            "weights_gib": self.weights / GIB,
            "per_conversation_gib": self.per_conversation / GIB,
        }


_PLANS: dict[tuple[str, torch.dtype], TranscriberPlan] = {}


def plan_transcriber_memory(cfg: STTConfig, dtype: torch.dtype = torch.bfloat16) -> TranscriberPlan:
    """The :class:`TranscriberPlan` of ``cfg`` with its LM in ``dtype`` (on ``meta``: no memory used)."""
    key = (repr(cfg), dtype)
    if key not in _PLANS:
        with torch.device("meta"):
            model = SpeechToText(cfg).to(dtype)
        weights = sum(_bytes(t) for t in [*model.parameters(), *model.buffers()])

        def row_bytes(rows: int) -> int:
            transcriber = Transcriber(model, rows)
            codes = torch.zeros(rows, cfg.n_q, dtype=torch.long, device="meta")
            state = sum(_bytes(t) for t in _tensors(transcriber.state)) + _bytes(codes)
            live = torch.ones(rows, dtype=torch.bool, device="meta")
            return state + peak_bytes(lambda: transcriber.step(codes, live), torch.device("meta"))

        per_conversation = -(-(row_bytes(1 + SPAN) - row_bytes(1)) // SPAN)
        _PLANS[key] = TranscriberPlan(cfg.name, weights, per_conversation)
    return _PLANS[key]


def room_for_transcriber(model: LoadedModel, plan: TranscriberPlan, per_conversation: int, reserve: int) -> str | None:
    """Why the device has no room for a transcriber beside ``model`` (its weights loaded, not the transcriber's),
    with one conversation of both (``per_conversation``: the model's) and ``reserve`` left; None: room (or no GPU
    memory to size by)."""
    free = free_device_memory(model.device)
    if free is None:
        return None
    need = plan.weights + plan.per_conversation + per_conversation + reserve
    if free >= need:
        return None
    return (
        f"{free / GIB:.1f} GiB free on {model.device}, {need / GIB:.1f} GiB needed for its weights and one "
        f"conversation with the {reserve / GIB:.1f} GiB reserve"
    )


def transcriber_for(
    source: str, model: LoadedModel, *, required: bool, reserve: int, depformer_steps: int | None = None
) -> tuple[LoadedTranscriber | None, int]:
    """Load the transcriber ``source`` beside ``model``; with its bytes per conversation (for ``--slots auto``).

    Not ``required`` (``--transcribe auto``), it is first planned from its config and left out, with one
    warning, when the GPU has no room for its weights and one conversation of both beside ``reserve``.

    Error handling: :class:`~pplex_trio.engine._transcribing.TranscriberUnavailable` when ``required``.
    """
    try:
        cfg = load_stt_config(source)
    except (ModelAccessError, ValueError, OSError) as exc:
        if required:
            raise TranscriberUnavailable(f"--transcribe {source}: {exc}") from exc
        logger.warning("--transcribe auto: %s cannot be used (%s); the caller's words are not transcribed", source, exc)
        return None, 0
    plan = plan_transcriber_memory(cfg, lm_dtype_for(model.device))
    if not required:
        ours = plan_memory(model.config, model.lm.dtype, depformer_steps=depformer_steps, precision=model.lm.precision)
        why = room_for_transcriber(model, plan, ours.fixed + ours.per_conversation, reserve)
        if why is not None:
            logger.warning(
                "--transcribe auto: no room for %s beside %s (%s); the caller's words are not transcribed",
                source,
                model.name,
                why,
            )
            return None, 0
    loaded = load_for_engine(source, model, required=required)
    return loaded, 0 if loaded is None else plan.per_conversation
