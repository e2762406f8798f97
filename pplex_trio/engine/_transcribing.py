"""The caller's words in the engine: a transcriber stepped in the same tick, on the same Mimi codes.

When the engine has a transcriber (Kyutai's streaming STT,
:class:`~pplex_trio.model.Transcriber`), each tick's one Mimi encode of the
LIVE rows' input gives all the levels it reads (32); PersonaPlex takes the
first 8 of them, bit for bit the codes it would get alone, so its tokens do
not change.  The transcriber then steps the same rows with the same mask:
an IDLE row (free, or running its system prompt) does not move, and a row's
transcription starts afresh when its row does (``reset``).  The system
prompt never reaches it: only the caller's audio does.

:class:`EngineTranscriber` is the transcriber's part of the tick: its
state, the codes buffer the tick fills, its step into three columns of the
tick's packed read-back (the text token, whether it is valid, the
end-of-turn probability), and each row's text decoder on the host.

A step that raises costs the words of that tick: the rows it stepped start
their transcription afresh (their state may be half-moved), the tick's
columns say "no text", and the conversation goes on (the engine counts it).

One encode serves both models only if they were trained on the same Mimi:
:func:`check_same_mimi` refuses a pair whose Mimi differs (config or
weights), except the random-weight ``tiny-stt``, which runs on whatever
codes it is given (the tiny PersonaPlex's, in tests).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from ..model import TINY_STT, LoadedModel, LoadedTranscriber, StreamDecoder, Transcriber

logger = logging.getLogger(__name__)

HEARD_COLUMNS = 3
"""Columns of the tick's packed read-back the transcriber writes: token, valid, end-of-turn probability."""

WARN_EVERY_S = 60.0
"""A failing transcriber step is logged at most once in this long (each failure is counted)."""


def check_same_mimi(model: LoadedModel, stt: LoadedTranscriber) -> None:
    """Whether PersonaPlex's Mimi encode can serve ``stt``: enough levels, the same codebook size and frame,
    and (but for ``tiny-stt``) the same Mimi, config and weights.

    Error handling: ``ValueError`` saying what differs and what to do.
    """
    mimi, cfg = model.mimi, stt.config
    fix = "choose a transcriber trained on this Mimi (Kyutai's STT models share PersonaPlex's), or --transcribe off"
    if mimi.stored_codebooks < cfg.n_q:
        raise ValueError(
            f"{stt.name} reads {cfg.n_q} levels of the caller's Mimi codes, but {model.name}'s Mimi stores "
            f"{mimi.stored_codebooks}: {fix}"
        )
    ours = model.config.mimi
    if ours.quantizer.bins != cfg.card or ours.frame_size != cfg.mimi.frame_size:
        raise ValueError(
            f"{stt.name} reads codes of {cfg.card} entries per {cfg.mimi.frame_size}-sample frame, {model.name}'s "
            f"Mimi makes {ours.quantizer.bins} per {ours.frame_size}: {fix}"
        )
    if stt.name == TINY_STT:
        return  # random weights: any Mimi's codes will do

    def shape(c: object) -> object:
        return dataclasses.replace(c, num_codebooks=cfg.n_q, reference="kyutai")  # type: ignore[type-var]

    theirs = stt.mimi.state_dict()
    same = shape(ours) == shape(cfg.mimi) and all(
        name in theirs and torch.equal(tensor, theirs[name].to(tensor.device))
        for name, tensor in mimi.state_dict().items()
    )
    if not same:
        raise ValueError(
            f"{stt.name} was trained on another Mimi than {model.name}'s (its config or weights differ), so one "
            f"encode cannot serve both: {fix}"
        )


class EngineTranscriber:
    """A transcriber over the engine's ``batch_size`` rows: its state, its input codes, its host decoders.

    ``codes`` (long ``[B, n_q]``) is filled by the tick's Mimi encode;
    :meth:`step` writes the :data:`HEARD_COLUMNS` of ``out``.  Its own Mimi
    is released: the engine's encode serves it (:func:`check_same_mimi`).
    """

    def __init__(self, loaded: LoadedTranscriber, batch_size: int):
        self.loaded = loaded
        self.config = loaded.config
        self.name = loaded.name
        self.transcriber = Transcriber(loaded.model, batch_size)
        self.codes = torch.zeros(batch_size, self.config.n_q, dtype=torch.long, device=loaded.device)
        self.decoders: list[StreamDecoder | None] = [None] * batch_size
        self.failures = 0
        self._warned = -WARN_EVERY_S
        loaded.mimi.to("meta")  # (its memory back: the engine's Mimi encodes for both)

    @property
    def levels(self) -> int:
        """The Mimi levels it reads (32 for Kyutai's models)."""
        return self.config.n_q

    @property
    def delay_s(self) -> float:
        """Seconds its text runs behind the caller's audio (the model's ``audio_delay_seconds``)."""
        return self.config.audio_delay_seconds

    # --- on the device -----------------------------------------------------------------

    def step(self, live: torch.Tensor, out: torch.Tensor) -> None:
        """One frame of the rows in ``live`` (bool ``[B]``) from :attr:`codes`, into ``out`` ``[B, 3]``
        (float32: the token, 1 where valid, the end-of-turn probability or 0).  Graph-safe: no host sync."""
        step = self.transcriber.step(self.codes, live)
        out[:, 0].copy_(step.text)
        out[:, 1].copy_(step.valid)
        if step.end_of_turn is not None:
            out[:, 2].copy_(step.end_of_turn)

    def step_guarded(self, live: torch.Tensor, out: torch.Tensor) -> bool:
        """:meth:`step`; True when it raised (then as :meth:`lose_tick`), for the eager engine."""
        try:
            self.step(live, out)
        except Exception as exc:  # any failure of the transcriber costs words, never the conversation
            self.lose_tick(live, out, exc)
            return True
        return False

    def reset(self, mask: torch.Tensor) -> None:
        """Rows in ``mask`` start a fresh transcription (their conversation starts or ends)."""
        self.transcriber.reset(mask)

    def lose_tick(self, live: torch.Tensor, out: torch.Tensor, error: BaseException) -> None:
        """A :meth:`step` raised: the stepped rows start afresh, ``out`` says no text; one warning a minute."""
        self.failures += 1
        self.reset(live)
        out[:, 1].zero_()
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY_S:
            self._warned = now
            logger.warning(
                "the transcriber's step failed (%s: %s; %d so far): this tick's words of the caller are lost, "
                "the conversations go on",
                type(error).__name__,
                error,
                self.failures,
            )

    # --- on the host -------------------------------------------------------------------

    def start_row(self, slot: int) -> None:
        """Row ``slot`` begins a conversation: a fresh text decoder (its device state is reset with the row)."""
        self.decoders[slot] = self.loaded.tokenizer.decoder()

    def end_row(self, slot: int) -> None:
        """Row ``slot`` has no conversation any more."""
        self.decoders[slot] = None

    def end_all(self) -> None:
        """No row has a conversation any more (the engine was reset)."""
        self.decoders = [None] * len(self.decoders)

    def pieces(
        self, rows: list[int], token: list[int], valid: list[bool], end_of_turn: list[float], batch_size: int
    ) -> tuple[list[str | None], list[float | None]]:
        """Per row: the text piece of this tick (None: padding, or not live) and its end-of-turn probability
        (None where the model has no such head, or the row is not live)."""
        text: list[str | None] = [None] * batch_size
        turn: list[float | None] = [None] * batch_size
        has_turn = self.config.has_end_of_turn
        for i in rows:
            decoder = self.decoders[i]
            if valid[i] and decoder is not None:
                text[i] = decoder.push(token[i])
                turn[i] = end_of_turn[i] if has_turn else None
        return text, turn


class TranscriberUnavailable(ValueError):
    """A transcriber asked for by name cannot be loaded or used with this model; the message says why."""


def load_for_engine(source: str, model: LoadedModel, *, required: bool) -> LoadedTranscriber | None:
    """Load the transcriber ``source`` (``tiny-stt``, a hub repo id, a folder) onto ``model``'s device and check
    that ``model``'s Mimi can serve it; ``required=False`` (``--transcribe auto``) turns a failure into None and
    one warning.

    Error handling: :class:`TranscriberUnavailable` with the reason, when ``required``.
    """
    from ..model import CheckpointMismatchError, ModelAccessError, load_transcriber

    try:
        loaded = load_transcriber(source, device=model.device)
        check_same_mimi(model, loaded)
    except (ModelAccessError, CheckpointMismatchError, ValueError, OSError, torch.OutOfMemoryError) as exc:
        if required:
            raise TranscriberUnavailable(f"--transcribe {source}: {exc}") from exc
        logger.warning("--transcribe auto: %s cannot be used (%s); the caller's words are not transcribed", source, exc)
        return None
    return loaded
