"""Slots and admission: who may use which row of the engine.

A *slot* is one row of the engine's batch.  A *lease* (``engine/_lease.py``)
is one conversation's claim on a slot, from the moment it asks (maybe waiting
in the queue) until it ends.  Slots move FREE → PREFILL → LIVE → DRAINING →
FREE.  A released slot stays DRAINING until the actor is between engine calls,
so an engine call still in flight never mixes the old conversation with a new
one (drain before release).  Every change of a lease's state that the engine
makes is made here, by the :class:`SlotTable`, which the engine actor calls
between engine calls.

A conversation that ends because its client left (not one the server ended)
while others wait leaves its slot *held* for that client (its address) for :data:`RETURN_WINDOW`:
a client that reconnects at once, as LiveKit's PersonaPlex plugin does to
change its persona, gets its slot back ahead of the queue instead of waiting
at its back.  Nobody else takes a held slot until the window has passed.
"""

from __future__ import annotations

import collections
import dataclasses
import enum

import numpy as np

from .._conversation import CloseCode
from ._lease import Lease, LeaseFailure, LeaseState, OutputFrame


class SlotPhase(enum.Enum):
    FREE = "free"
    PREFILL = "prefill"
    LIVE = "live"
    DRAINING = "draining"


RETURN_WINDOW = 2.0  # seconds a slot is held for the client that just left it


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full."""


@dataclasses.dataclass
class Slot:
    index: int
    phase: SlotPhase = SlotPhase.FREE
    lease: Lease | None = None
    started: bool = False  # engine.start() has run for this lease
    prefill_left: int = 0
    held_for: str | None = None  # the client that left it may come back to it until `held_until`
    held_until: float = 0.0

    def held_against(self, client: str | None, now: float) -> bool:
        """Held, for another client than ``client``, at time ``now``."""
        return self.held_for is not None and self.held_for != client and now < self.held_until

    def held_by(self, client: str | None, now: float) -> bool:
        return client is not None and self.held_for == client and now < self.held_until


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

    def request(self, lease: Lease, now: float) -> None:
        """Give ``lease`` a free slot, or a place in the queue, or raise :class:`QueueFull`.

        A client coming back to a slot held for it is served first (or waits at the front while it drains).
        """
        returning = any(slot.held_by(lease.client, now) for slot in self.slots)
        if returning or not self._queue:
            slot = self._free_slot(lease.client, now)
            if slot is not None:
                self._assign(slot, lease)
                return
        if returning:
            self._queue.appendleft(lease)
            self._renumber()
            return
        if len(self._queue) >= self.queue_size:
            raise QueueFull(
                f"all {len(self.slots)} conversation slots are busy and the waiting queue is full "
                f"({self.queue_size}); try again later"
            )
        self._queue.append(lease)
        lease._set(LeaseState.QUEUED, position=len(self._queue))

    def release(self, lease: Lease, now: float, *, hold: bool = False) -> None:
        """The conversation is over; its slot drains before anyone else gets it (``hold``: the client left, and
        if others wait, the slot waits :data:`RETURN_WINDOW` for it to come back)."""
        if lease in self._queue:
            self._queue.remove(lease)
            self._renumber()
        elif lease.slot is not None:
            slot = self.slots[lease.slot]
            if slot.lease is lease:
                slot.phase = SlotPhase.DRAINING
                slot.lease = None
                if hold and lease.client is not None and self._queue:  # (nobody waiting: nothing to hold against)
                    slot.held_for, slot.held_until = lease.client, now + RETURN_WINDOW
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

    def restart_prompts(self) -> list[int]:
        """Slots whose conversation asked for its prompt again (:meth:`Lease.restart`): back to PREFILL with the
        new settings, their rows to be reset.  Safe only while no engine call is in flight."""
        rows = []
        for slot in self.slots:
            lease = slot.lease
            if lease is None or lease._restart_with is None:
                continue
            lease.conversation, lease._restart_with = lease._restart_with, None
            if slot.phase is SlotPhase.LIVE:
                lease._framer.back_to_early()
                lease._set(LeaseState.PREFILL)
            slot.phase = SlotPhase.PREFILL
            slot.started = False
            slot.prefill_left = 0
            rows.append(slot.index)
        return rows

    def admit_waiting(self, now: float) -> None:
        """Hand free slots to the longest-waiting leases (a held slot only to its client)."""
        changed = False
        for lease in list(self._queue):
            slot = self._free_slot(lease.client, now)
            if slot is not None:
                self._queue.remove(lease)
                self._assign(slot, lease)
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
        lease._end_output_if_flushed()  # (output alone wakes only the send task, through the outbox)

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

    def free_count(self, now: float) -> int:
        """FREE slots that a newcomer could take now (held ones excluded)."""
        return sum(slot.phase is SlotPhase.FREE and not slot.held_against(None, now) for slot in self.slots)

    def _free_slot(self, client: str | None, now: float) -> Slot | None:
        """A FREE slot for ``client``: the one held for it first, else one held for nobody else."""
        free = [slot for slot in self.slots if slot.phase is SlotPhase.FREE and not slot.held_against(client, now)]
        return next((slot for slot in free if slot.held_by(client, now)), free[0] if free else None)

    def _assign(self, slot: Slot, lease: Lease) -> None:
        slot.phase = SlotPhase.PREFILL
        slot.lease = lease
        slot.started = False
        slot.held_for = None
        lease._set(LeaseState.PREFILL, slot=slot.index)

    def _go_live(self, slot: Slot) -> None:
        assert slot.lease is not None
        slot.phase = SlotPhase.LIVE
        slot.lease._go_live()

    def _renumber(self) -> None:
        for position, lease in enumerate(self._queue, start=1):
            if lease.position != position:
                lease._set(LeaseState.QUEUED, position=position)
