"""What the engine hands a conversation: its output frames, in an outbox that drops the oldest audio.

A slow reader loses audio, never text: a dropped frame's text piece rides on
the next frame (:func:`carry_text`).  ``async for batch in lease.frames()``
reads everything waiting at once (:class:`OutputBatches`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import trio

from .._channel import DropOldestChannel


@dataclasses.dataclass
class OutputFrame:
    """One engine output for one conversation.

    ``input_arrival`` is when the last sample of the input frame consumed in
    the same tick reached the server (``None`` if the tick had no input), and
    ``step_seconds`` the engine's compute time in that tick: the send task
    turns them into the server-added latency of this frame.
    """

    pcm: np.ndarray
    text: str | None
    tick: int
    input_arrival: float | None = None
    step_seconds: float = 0.0
    tick_started: float = 0.0  # when the tick that made it began
    delivered: float = 0.0  # when it reached the outbox


@dataclasses.dataclass(frozen=True)
class OutputEnd:
    """The last output event of a flushed conversation: every input frame has had its answer."""


OutputEvent = OutputFrame | OutputEnd


def carry_text(dropped: OutputEvent, successor: OutputEvent) -> None:
    """A dropped frame's audio is gone, but its text piece goes out with the next frame."""
    if isinstance(dropped, OutputFrame) and isinstance(successor, OutputFrame) and dropped.text:
        successor.text = dropped.text + (successor.text or "")


class OutputBatches:
    """``async for batch in lease.frames()``: no async generator, so nothing to finalize."""

    def __init__(self, outbox: DropOldestChannel[OutputEvent]):
        self._outbox = outbox

    def __aiter__(self) -> OutputBatches:
        return self

    async def __anext__(self) -> list[OutputEvent]:
        try:
            return await self._outbox.receive_batch()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
