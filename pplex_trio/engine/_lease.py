"""A lease: one conversation's claim on an engine slot, and the session's side of the engine.

A :class:`Lease` is the session's handle and nothing more: it reads state and
pushes input, flushes, reads output events and ends.  Its state changes only
through :meth:`Lease._set`, called by the :class:`~pplex_trio.engine._slots.SlotTable`
(between engine calls) and by the lease's own flush; the underscored methods
and counters are the table's side.  Everything runs on the Trio thread and is
synchronous, except waiting.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

import numpy as np
import trio

from .._channel import DropOldestChannel
from .._conversation import CloseCode, Conversation
from ._framing import InputFramer


class LeaseState(enum.Enum):
    """A conversation's claim on a slot (the transitions: :data:`_LEASE_NEXT`, entered only by ``Lease._set``).

    ::

        QUEUED ──► PREFILL ◄─► LIVE ──► FLUSHING ──► FLUSHED
           │          │  └──────────────────▲           │
           └──────────┴──── FAILED ◄────────┴───────────┘   (and every state ──► ENDED)

    LIVE ──► PREFILL: the conversation asked for its prompt again with new
    settings (:meth:`Lease.restart`, a persona change) and runs it in its slot.
    FLUSHING: the input has ended; the output ends once every frame taken has
    its answer (FLUSHED: its ``OutputEnd`` is out, nothing follows).  A flush
    asked before LIVE takes effect when the prompt is done (PREFILL ──►
    FLUSHING).  FAILED: the server ended it (``failure`` says why); its input is
    refused.  ENDED: the session gave the slot back.
    """

    QUEUED = "queued"
    PREFILL = "prefill"
    LIVE = "live"
    FLUSHING = "flushing"
    FLUSHED = "flushed"
    FAILED = "failed"
    ENDED = "ended"


_LEASE_NEXT = {
    LeaseState.QUEUED: {LeaseState.QUEUED, LeaseState.PREFILL, LeaseState.FAILED},  # (QUEUED: a new position)
    LeaseState.PREFILL: {LeaseState.LIVE, LeaseState.FLUSHING, LeaseState.FAILED},
    LeaseState.LIVE: {LeaseState.PREFILL, LeaseState.FLUSHING, LeaseState.FAILED},
    LeaseState.FLUSHING: {LeaseState.FLUSHED, LeaseState.FAILED},
    LeaseState.FLUSHED: {LeaseState.FAILED},
    LeaseState.FAILED: set(),
    LeaseState.ENDED: set(),
}
LIVE_STATES = frozenset({LeaseState.LIVE, LeaseState.FLUSHING, LeaseState.FLUSHED})  # the prompt is behind it


class LeaseFailed(Exception):
    """Input for a conversation the server has ended; ``failure`` says why."""

    def __init__(self, failure: LeaseFailure):
        super().__init__(failure.message)
        self.failure = failure


@dataclasses.dataclass(frozen=True)
class LeaseFailure:
    """Why the server ended a conversation: tell the client, then close with ``code``."""

    code: CloseCode
    message: str


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


@dataclasses.dataclass(frozen=True)
class InputStats:
    """The input framer's view of one conversation, in samples (for ``/api/sessions``)."""

    pending: int
    margin: int
    underruns: int
    skipped: int


def _carry_text(dropped: OutputEvent, successor: OutputEvent) -> None:
    """A dropped frame's audio is gone, but its text piece goes out with the next frame."""
    if isinstance(dropped, OutputFrame) and isinstance(successor, OutputFrame) and dropped.text:
        successor.text = dropped.text + (successor.text or "")


class Lease:
    """One conversation's claim on an engine slot: the session's side of the engine.

    Read ``state``, ``position`` (in the queue) and ``failure``, and wait for
    any of them to change with :meth:`wait_changed`.  Push input with
    :meth:`push_input`; read output with ``async for batch in lease.frames()``;
    :meth:`flush` asks for an :class:`OutputEnd` once every pending input frame
    has had its answer; :meth:`end` gives the slot back (it drains first).
    """

    def __init__(
        self,
        conversation: Conversation,
        *,
        framer: InputFramer,
        output_capacity: int,
        on_drop: Callable[[str, int], None],
        on_input: Callable[[Lease], None],
        on_end: Callable[[Lease, bool], None],
        early_audio: bool = False,
        client: str | None = None,
    ):
        self.conversation = conversation
        self.client = client  # who asked (an address): a slot it leaves may be held for it (see SlotTable)
        self._framer = framer
        self._early_audio = early_audio
        self._outbox: DropOldestChannel[OutputEvent] = DropOldestChannel(
            output_capacity, name="output_backlog", on_drop=lambda name: on_drop(name, 1), salvage=_carry_text)
        self._on_drop = on_drop
        self._on_input = on_input
        self._on_end = on_end
        self._state = LeaseState.QUEUED
        self._slot: int | None = None
        self._position = 0
        self._failure: LeaseFailure | None = None  # why, once FAILED
        self._prefill_total = 0
        self._restart_with: Conversation | None = None  # new settings, for the prompt to run again with
        self._frames_consumed = 0  # real input frames the engine took
        self._frames_delivered = 0  # output frames put into the outbox
        self._last_consumed_tick = -1
        self._last_delivered_tick = -1
        self._lot = trio.lowlevel.ParkingLot()

    # -- what the session reads ----------------------------------------------

    @property
    def state(self) -> LeaseState:
        return self._state

    @property
    def slot(self) -> int | None:
        return self._slot

    @property
    def position(self) -> int:
        """1-based place in the queue while QUEUED, else 0."""
        return self._position

    @property
    def failure(self) -> LeaseFailure | None:
        return self._failure

    @property
    def prefill_total(self) -> int:
        return self._prefill_total

    @property
    def frames_consumed(self) -> int:
        """Real input frames the engine took (silence fill excluded)."""
        return self._frames_consumed

    @property
    def last_input_arrival(self) -> float:
        """When its newest input arrived (-inf before any)."""
        return self._framer.last_arrival

    @property
    def frames_delivered(self) -> int:
        """Output frames put into the outbox (some may have been dropped since)."""
        return self._frames_delivered

    @property
    def output_dropped(self) -> int:
        return self._outbox.dropped

    def input_stats(self) -> InputStats:
        f = self._framer
        return InputStats(f.pending_samples, f.margin, f.underruns, f.skipped_samples)

    async def wait_changed(self) -> None:
        """Wait until state, position or failure changes (output is read from :meth:`frames`)."""
        await self._lot.park()

    # -- what the session does -----------------------------------------------

    def push_input(self, pcm: np.ndarray, arrived_at: float) -> bool:
        """Queue input PCM that reached the server at ``arrived_at``; False when it is dropped.

        Before LIVE, a lease made with ``early_audio`` keeps the last few
        seconds of it for the model (queued ahead of the live audio when the
        conversation goes live; see ``InputFramer.keep_early``);
        otherwise input before LIVE is audio the model was never going to
        hear (the client should wait for the handshake).  On overflow the
        oldest frames go.  After a flush nothing is taken.

        Error handling: :class:`LeaseFailed` for a FAILED lease.
        """
        if self._state is LeaseState.FAILED:
            assert self._failure is not None
            raise LeaseFailed(self._failure)
        if self._framer.input_ended or self._state is LeaseState.ENDED:
            return False
        if self._state is not LeaseState.LIVE:
            if not self._early_audio:
                return False
            self._on_drop("input_backlog", self._framer.keep_early(pcm, arrived_at))
            return True
        self._on_drop("input_backlog", self._framer.push(pcm, arrived_at))
        self._on_input(self)
        return True

    def flush(self) -> None:
        """No more input: pad the last frame, and end the output once everything is answered (a flush before
        LIVE takes effect when the conversation goes live)."""
        if self._framer.input_ended:
            return
        self._framer.input_ended = True
        if self._state is LeaseState.LIVE:
            self._start_flushing()

    @property
    def early_audio_kept(self) -> bool:
        """Whether audio pushed before LIVE waits for the model (see :meth:`push_input`)."""
        return self._framer.early_samples > 0

    def frames(self) -> _OutputBatches:
        """Output events, in batches of everything waiting (at least one); ends when the lease does."""
        return _OutputBatches(self._outbox)

    def restart(self, conversation: Conversation) -> bool:
        """Run the system prompt again with ``conversation`` (its persona, voice, sampling) in the same slot:
        a persona change without leaving.  The lease is PREFILL until it has run; what the client says
        meanwhile is kept for the model as before its first handshake (``early_audio``).  False when it
        is too late (the input has ended, or the conversation is over)."""
        if self._state is LeaseState.QUEUED:
            self.conversation = conversation  # nothing has run yet
            return True
        if self._state not in (LeaseState.PREFILL, LeaseState.LIVE) or self._framer.input_ended:
            return False
        self._restart_with = conversation  # taken by the SlotTable at the next engine call
        return True

    def end(self, *, client_left: bool = False) -> None:
        """The conversation is over: give the slot back (it drains before anyone else gets it).

        ``client_left``: it ended because the client left (not by the server's doing), so the slot is held a
        moment for the same client to come back (a persona change).
        """
        if self._state is not LeaseState.ENDED:
            self._on_end(self, client_left)

    # -- the engine's side, called only by the SlotTable ----------------------

    def _go_live(self) -> None:
        if self._framer.catch_up():
            self._on_input(self)
        if self._framer.input_ended:
            self._start_flushing()
        else:
            self._set(LeaseState.LIVE)

    def _start_flushing(self) -> None:
        self._framer.pad_to_frame()
        self._set(LeaseState.FLUSHING)
        self._end_output_if_flushed()

    def _fail(self, failure: LeaseFailure) -> None:
        if self._state in (LeaseState.FAILED, LeaseState.ENDED):
            return
        self._failure = failure
        self._set(LeaseState.FAILED)

    def _changed(self) -> None:
        self._lot.unpark_all()

    def _set(self, state: LeaseState, *, slot: int | None = None, position: int = 0) -> None:
        """The one place a lease changes state; a move its lifecycle does not have is a bug (RuntimeError)."""
        if state is not LeaseState.ENDED and state not in _LEASE_NEXT[self._state]:
            raise RuntimeError(f"lease: no transition from {self._state.value} to {state.value}")
        self._state = state
        if slot is not None:
            self._slot = slot
        self._position = position
        if state is LeaseState.ENDED:
            self._outbox.close()
        self._changed()

    def _end_output_if_flushed(self) -> None:
        if (self._state is LeaseState.FLUSHING and not self._framer.pending_frames
                and self._last_delivered_tick >= self._last_consumed_tick):
            self._outbox.send_nowait(OutputEnd(), droppable=False)
            self._set(LeaseState.FLUSHED)


class _OutputBatches:
    """``async for batch in lease.frames()``: no async generator, so nothing to finalize."""

    def __init__(self, outbox: DropOldestChannel[OutputEvent]):
        self._outbox = outbox

    def __aiter__(self) -> _OutputBatches:
        return self

    async def __anext__(self) -> list[OutputEvent]:
        try:
            return await self._outbox.receive_batch()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
