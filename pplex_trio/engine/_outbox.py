"""What the engine hands a conversation: its output frames, in an outbox that keeps up with real time.

A client whose reading stalls (its downlink held up, then delivered at once)
finds what waited when it reads again: ``async for batch in lease.frames()``
takes all of it (:class:`OutputBatches`).  To get back to real time without
losing words, the model's **silent** frames of a backlog are not sent while
more than :data:`USUAL_FRAMES` wait, and when the outbox is full a silent
frame goes before a spoken one.  Audio dropped either way never takes text
with it: a dropped frame's text piece rides on the next frame
(:func:`carry_text`).  Whether a frame is silent is asked only then, never
on the tick's path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import trio

from .._channel import DropOldestChannel
from ..codec import is_silent

USUAL_FRAMES = 2  # what a reader keeping up finds waiting: this tick's frame, and the last one's at most


@dataclasses.dataclass
class OutputFrame:
    """One engine output for one conversation.

    ``heard`` is the input frame the model consumed in the same tick (silence
    where none waited): with ``pcm``, the conversation's timeline, what the
    model heard and what it said.  ``input_arrival`` is when the last sample
    of that input frame reached the server (``None`` if the tick had no
    input), and ``step_seconds`` the engine's compute time in that tick: the
    send task turns them into the server-added latency of this frame.

    With a transcriber, ``heard_text`` is the piece of the caller's words it
    wrote this tick (as ``text`` is the model's; None: none), about what the
    caller said ``Engine.transcript_delay`` seconds before ``heard``, and
    ``end_of_turn`` its probability that the caller's turn has ended.
    """

    pcm: np.ndarray
    text: str | None
    tick: int
    heard: np.ndarray | None = None
    input_arrival: float | None = None
    step_seconds: float = 0.0
    heard_text: str | None = None
    end_of_turn: float | None = None
    tick_started: float = 0.0  # when the tick that made it began
    delivered: float = 0.0  # when it reached the outbox
    _silent: bool | None = dataclasses.field(default=None, repr=False)

    @property
    def silent(self) -> bool:
        """The model says nothing in it (worked out once, when asked)."""
        if self._silent is None:
            self._silent = is_silent(self.pcm)
        return self._silent


@dataclasses.dataclass(frozen=True)
class OutputEnd:
    """The last output event of a flushed conversation: every input frame has had its answer."""


OutputEvent = OutputFrame | OutputEnd


def carry_text(dropped: OutputEvent, successor: OutputEvent) -> None:
    """A dropped frame's audio is gone, but its text pieces (the model's, the caller's) go out with the next
    frame, and its end-of-turn probability if higher."""
    if not isinstance(dropped, OutputFrame) or not isinstance(successor, OutputFrame):
        return
    if dropped.text:
        successor.text = dropped.text + (successor.text or "")
    if dropped.heard_text:
        successor.heard_text = dropped.heard_text + (successor.heard_text or "")
    if dropped.end_of_turn is not None:
        successor.end_of_turn = max(dropped.end_of_turn, successor.end_of_turn or 0.0)


def silent_frame(event: OutputEvent) -> bool:
    """A silent frame: what a full outbox drops first (``drop_first``)."""
    return isinstance(event, OutputFrame) and event.silent


def catch_up(batch: list[OutputEvent]) -> tuple[list[OutputEvent], int]:
    """What a reader that fell behind is sent of ``batch``: every event but the oldest silent frames beyond
    :data:`USUAL_FRAMES` (their text goes with the next frame); and how many frames were left out."""
    frames = sum(isinstance(event, OutputFrame) for event in batch)
    if frames <= USUAL_FRAMES:
        return batch, 0
    kept: list[OutputEvent] = []
    skipped = 0
    for index, event in enumerate(batch):
        if frames - skipped > USUAL_FRAMES and silent_frame(event) and index + 1 < len(batch):
            carry_text(event, batch[index + 1])
            skipped += 1
            continue
        kept.append(event)
    return kept, skipped


class OutputBatches:
    """``async for batch in lease.frames()``: no async generator, so nothing to finalize; a backlog comes
    without its silent frames (:func:`catch_up`), counted in ``skipped``."""

    def __init__(self, outbox: DropOldestChannel[OutputEvent], on_skip: Callable[[int], None]):
        self._outbox = outbox
        self._on_skip = on_skip

    def __aiter__(self) -> OutputBatches:
        return self

    async def __anext__(self) -> list[OutputEvent]:
        try:
            batch = await self._outbox.receive_batch()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        batch, skipped = catch_up(batch)
        if skipped:
            self._on_skip(skipped)
        return batch
