"""Slots, leases and admission: who may use which row of the engine.

A *slot* is one row of the engine's batch.  A *lease* is one conversation's
claim on a slot, from the moment it asks (maybe waiting in the queue) until it
ends.  Slots move FREE → PREFILL → LIVE → DRAINING → FREE.  A released slot
stays DRAINING until the actor is between engine calls, so an engine call
still in flight never mixes the old conversation with a new one (drain before
release).

A :class:`Lease` is the session's handle and nothing more: it reads state and
pushes input, flushes, reads output events and ends.  Every change of a
lease's state is made here, by the :class:`SlotTable`, which the engine actor
calls between engine calls.  Everything runs on the Trio thread and is
synchronous, except waiting.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Callable

import numpy as np
import trio

from .._channel import DropOldestChannel
from .._conversation import CloseCode, Conversation
from ._framing import InputFramer



class SlotPhase(enum.Enum):
    FREE = "free"
    PREFILL = "prefill"
    LIVE = "live"
    DRAINING = "draining"


class LeaseState(enum.Enum):
    """A conversation's claim on a slot (the transitions: :data:`_LEASE_NEXT`, entered only by ``Lease._set``).

    ::

        QUEUED ──► PREFILL ──► LIVE ──► FLUSHING ──► FLUSHED
           │          │  └──────────────────▲           │
           └──────────┴──── FAILED ◄────────┴───────────┘   (and every state ──► ENDED)

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
    LeaseState.LIVE: {LeaseState.FLUSHING, LeaseState.FAILED},
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


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full."""


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
        on_end: Callable[[Lease], None],
        early_audio: bool = False,
    ):
        self.conversation = conversation
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
        """Wait until state, position, failure or the output changes."""
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

    def end(self) -> None:
        """The conversation is over: give the slot back (it drains before anyone else gets it)."""
        if self._state is not LeaseState.ENDED:
            self._on_end(self)

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


@dataclasses.dataclass
class Slot:
    index: int
    phase: SlotPhase = SlotPhase.FREE
    lease: Lease | None = None
    started: bool = False  # engine.start() has run for this lease
    prefill_left: int = 0


class SlotTable:
    """The engine's slots plus the bounded queue of leases waiting for one.

    The only code that changes a lease's state.  The actor calls the tick
    methods between engine calls; :meth:`request` and :meth:`release` run
    whenever a session arrives or leaves.
    """

    def __init__(self, num_slots: int, *, queue_size: int):
        self.slots = [Slot(i) for i in range(num_slots)]
        self.queue_size = queue_size
        self._queue: collections.deque[Lease] = collections.deque()

    # -- sessions arrive and leave ---------------------------------------------

    def request(self, lease: Lease) -> None:
        """Give ``lease`` a free slot, or a place in the queue, or raise :class:`QueueFull`."""
        if not self._queue:
            slot = self._free_slot()
            if slot is not None:
                self._assign(slot, lease)
                return
        if len(self._queue) >= self.queue_size:
            raise QueueFull(
                f"all {len(self.slots)} conversation slots are busy and the waiting queue is full "
                f"({self.queue_size}); try again later"
            )
        self._queue.append(lease)
        lease._set(LeaseState.QUEUED, position=len(self._queue))

    def release(self, lease: Lease) -> None:
        """The conversation is over; its slot drains before anyone else gets it."""
        if lease in self._queue:
            self._queue.remove(lease)
            self._renumber()
        elif lease.slot is not None:
            slot = self.slots[lease.slot]
            if slot.lease is lease:
                slot.phase = SlotPhase.DRAINING
                slot.lease = None
        lease._set(LeaseState.ENDED)

    # -- between engine calls ------------------------------------------------

    def free_drained(self) -> list[int]:
        """DRAINING → FREE, safe only while no engine call is in flight."""
        freed = []
        for slot in self.slots:
            if slot.phase is SlotPhase.DRAINING:
                slot.phase = SlotPhase.FREE
                slot.started = False
                slot.prefill_left = 0
                freed.append(slot.index)
        return freed

    def admit_waiting(self) -> None:
        """Hand free slots to the longest-waiting leases."""
        changed = False
        while self._queue:
            slot = self._free_slot()
            if slot is None:
                break
            self._assign(slot, self._queue.popleft())
            changed = True
        if changed:
            self._renumber()

    def take_input(self, slot: Slot, out: np.ndarray, tick: int) -> tuple[float | None, int]:
        """Move the LIVE slot's next input frame into ``out``.

        Returns when the frame's last sample arrived (None: no whole frame
        waited) and how many samples the aligned framer skipped on the way.
        """
        lease = slot.lease
        assert lease is not None and slot.phase is SlotPhase.LIVE
        framer = lease._framer
        skipped = framer.skipped_samples
        arrived = framer.pop_frame_into(out)
        if arrived is not None:
            lease._frames_consumed += 1
            lease._last_consumed_tick = tick
        return arrived, framer.skipped_samples - skipped

    def has_due_page(self, slot: Slot, now: float, tick_seconds: float) -> bool:
        """A LIVE, aligned conversation still streaming whose frame ends at a page due about now."""
        lease = slot.lease
        return (slot.phase is SlotPhase.LIVE and lease is not None and lease._framer.awaits_page
                and now - lease._framer.last_arrival < tick_seconds)

    def has_input_frame(self, lease: Lease) -> bool:
        return bool(lease._framer.pending_frames)

    def still_streaming(self, slot: Slot, now: float, tick_seconds: float) -> bool:
        """The slot's conversation sent input recently, so a tick without its frame came too early."""
        lease = slot.lease
        return lease is not None and bool(lease.frames_consumed) and now - lease.last_input_arrival < 2 * tick_seconds

    def started(self, slot: Slot, positions: int) -> None:
        """``engine.start`` ran: ``positions`` of system prompt to run (0: live at once)."""
        assert slot.lease is not None
        slot.started = True
        slot.prefill_left = positions
        slot.lease._prefill_total = positions
        if positions == 0:
            self._go_live(slot)

    def prefilled(self, slot: Slot, positions: int) -> None:
        """``engine.prefill`` ran ``positions`` of the slot's prompt; at its end the conversation is live."""
        slot.prefill_left -= positions
        if slot.prefill_left <= 0 and slot.phase is SlotPhase.PREFILL:
            self._go_live(slot)

    def prompts_left(self) -> dict[int, int]:
        """Started slots whose prompt is not done: slot -> positions left."""
        return {slot.index: slot.prefill_left for slot in self.slots
                if slot.phase is SlotPhase.PREFILL and slot.started and slot.prefill_left > 0}

    def deliver(self, slot: Slot, frame: OutputFrame) -> None:
        lease = slot.lease
        assert lease is not None
        if lease.state is LeaseState.FLUSHED:
            return  # a flushed conversation's output is complete: nothing may follow its end
        lease._outbox.send_nowait(frame)
        lease._frames_delivered += 1
        lease._last_delivered_tick = frame.tick
        lease._end_output_if_flushed()
        lease._changed()

    def fail_slot(self, slot: Slot, code: CloseCode, message: str) -> None:
        """End the slot's conversation from the server side (engine error)."""
        lease = slot.lease
        slot.phase = SlotPhase.DRAINING
        slot.lease = None
        if lease is not None:
            lease._fail(LeaseFailure(code, message))

    # -- views ---------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._queue)

    def count(self, phase: SlotPhase) -> int:
        return sum(slot.phase is phase for slot in self.slots)

    def busy(self) -> bool:
        return bool(self._queue) or any(slot.phase is not SlotPhase.FREE for slot in self.slots)

    def _free_slot(self) -> Slot | None:
        for slot in self.slots:
            if slot.phase is SlotPhase.FREE:
                return slot
        return None

    def _assign(self, slot: Slot, lease: Lease) -> None:
        slot.phase = SlotPhase.PREFILL
        slot.lease = lease
        slot.started = False
        lease._set(LeaseState.PREFILL, slot=slot.index)

    def _go_live(self, slot: Slot) -> None:
        assert slot.lease is not None
        slot.phase = SlotPhase.LIVE
        slot.lease._go_live()

    def _renumber(self) -> None:
        for position, lease in enumerate(self._queue, start=1):
            if lease.position != position:
                lease._set(LeaseState.QUEUED, position=position)
