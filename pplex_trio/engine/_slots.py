"""Slots, leases and admission: who may use which row of the engine.

A *slot* is one row of the engine's batch.  A *lease* is one conversation's
claim on a slot, from the moment it asks (maybe waiting in the queue) until it
ends.  Slots move FREE → PREFILL → LIVE → DRAINING → FREE.  A released slot
stays DRAINING until the actor is between engine calls, so an engine call
still in flight never mixes the old conversation with a new one (drain before
release).

Everything here runs on the Trio thread and is synchronous.
"""

from __future__ import annotations

import collections
import dataclasses
import enum

import numpy as np
import trio

from .._channel import DropOldestChannel
from ._framing import InputFramer
from ._interface import Conversation


class SlotPhase(enum.Enum):
    FREE = "free"
    PREFILL = "prefill"
    LIVE = "live"
    DRAINING = "draining"


class LeaseState(enum.Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    LIVE = "live"
    ENDED = "ended"


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full."""


@dataclasses.dataclass(frozen=True)
class LeaseFailure:
    """Why the server ended a conversation: tell the client, then close with ``code``."""

    code: int
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


class Lease:
    """One conversation's claim on an engine slot.

    The session reads ``state``/``position``/``failure`` and waits with
    :meth:`wait_changed`; it pushes input PCM through :meth:`push_input` and
    reads engine output from ``outbox``.
    """

    def __init__(self, conversation: Conversation, *, framer: InputFramer, outbox: DropOldestChannel[OutputFrame]):
        self.conversation = conversation
        self.framer = framer
        self.outbox = outbox
        self.state = LeaseState.QUEUED
        self.slot: int | None = None
        self.position = 0  # 1-based place in the queue while QUEUED
        self.failure: LeaseFailure | None = None
        self.prefill_total = 0
        self.frames_consumed = 0  # real input frames the engine took
        self.frames_delivered = 0  # output frames put into the outbox
        self.last_consumed_tick = -1  # tick that took the newest real input frame
        self.last_delivered_tick = -1  # tick of the newest output frame
        self._lot = trio.lowlevel.ParkingLot()

    def notify(self) -> None:
        self._lot.unpark_all()

    async def wait_changed(self) -> None:
        """Wait until state, position, failure or delivery counters change."""
        await self._lot.park()

    def fail(self, code: int, message: str) -> None:
        if self.failure is None:
            self.failure = LeaseFailure(code, message)
        self.notify()


@dataclasses.dataclass
class Slot:
    index: int
    phase: SlotPhase = SlotPhase.FREE
    lease: Lease | None = None
    started: bool = False  # engine.start() has run for this lease
    prefill_left: int = 0


class SlotTable:
    """The engine's slots plus the bounded queue of leases waiting for one."""

    def __init__(self, num_slots: int, *, queue_size: int):
        self.slots = [Slot(i) for i in range(num_slots)]
        self.queue_size = queue_size
        self._queue: collections.deque[Lease] = collections.deque()

    # -- session side -------------------------------------------------------

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
        lease.position = len(self._queue)
        lease.notify()

    def release(self, lease: Lease) -> None:
        """The conversation is over; its slot drains before anyone else gets it."""
        if lease.state is LeaseState.QUEUED and lease in self._queue:
            self._queue.remove(lease)
            self._renumber()
        elif lease.slot is not None:
            slot = self.slots[lease.slot]
            if slot.lease is lease:
                slot.phase = SlotPhase.DRAINING
                slot.lease = None
        lease.state = LeaseState.ENDED
        lease.notify()

    # -- actor side (only between engine calls) -----------------------------

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

    def fail_slot(self, slot: Slot, code: int, message: str) -> None:
        """End the slot's conversation from the server side (engine error)."""
        lease = slot.lease
        slot.phase = SlotPhase.DRAINING
        slot.lease = None
        if lease is not None:
            lease.fail(code, message)

    def go_live(self, slot: Slot) -> None:
        slot.phase = SlotPhase.LIVE
        assert slot.lease is not None
        slot.lease.state = LeaseState.LIVE
        slot.lease.notify()

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
        lease.slot = slot.index
        lease.state = LeaseState.PREFILL
        lease.position = 0
        lease.notify()

    def _renumber(self) -> None:
        for position, lease in enumerate(self._queue, start=1):
            if lease.position != position:
                lease.position = position
                lease.notify()
