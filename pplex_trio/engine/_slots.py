"""Slots and admission: who may use which row of the engine.

A *slot* is one row of the engine's batch; a *lease* (its engine end: ``engine/_engine_lease.py``)
is one conversation's claim on a slot, from the moment it asks (maybe waiting
in the queue) until its slot is free again.  A slot's state is its lease's
state (``LeaseState``), or free.  A lease the session gave back is DRAINING
until the actor is between engine calls, so an engine call still in flight
never mixes the old conversation with a new one (drain before release).
The :class:`SlotTable` decides who gets which slot; it asks its leases and
tells them what happened, never writing their fields.

A conversation whose connection dropped may be PAUSED instead (``_resume.py``): not stepped, its
state kept, its slot counted as held, until its client resumes it or its window lapses.

A conversation that ends because its client left (not one the server ended)
while others wait leaves its slot HELD for that client (its address) for
:data:`RETURN_WINDOW`: a client that reconnects at once, as LiveKit's
PersonaPlex plugin does to change its persona, gets its slot back ahead of
the queue instead of waiting at its back.  Nobody else takes a held slot
until the window has passed.
"""

from __future__ import annotations

import collections
import math

from ._engine_lease import EngineLease
from ._lease_core import LIVE_STATES, LeaseFailure, LeaseState

RETURN_WINDOW = 2.0  # seconds a slot is held for the client that just left it

# What ``/health`` and the ``pplex_slots`` gauge call a slot in each state of its lease.
SLOT_STATES = ("free", "prefill", "live", "draining", "held")
_SLOT_STATE = {
    LeaseState.STARTING: "prefill",
    LeaseState.PREFILL: "prefill",
    LeaseState.READY: "live",
    LeaseState.LIVE: "live",
    LeaseState.FLUSHING: "live",
    LeaseState.FLUSHED: "live",
    LeaseState.PAUSED: "held",  # its connection dropped: kept for a resume
    LeaseState.FAILED: "draining",
    LeaseState.DRAINING: "draining",
    LeaseState.HELD: "held",
}


class QueueFull(Exception):
    """Every slot is busy and the waiting queue is full."""


class SlotTable:
    """The engine's slots (``rows``: each slot's lease, None when free) plus the bounded queue of leases waiting.

    :meth:`request` and :meth:`release` run whenever a session arrives or
    leaves; the rest between engine calls (the actor's plan and apply).
    """

    def __init__(self, num_slots: int, *, queue_size: int):
        self.rows: list[EngineLease | None] = [None] * num_slots
        self.queue_size = queue_size
        self._queue: collections.deque[EngineLease] = collections.deque()

    # -- sessions arrive and leave ---------------------------------------------

    def request(self, lease: EngineLease, now: float) -> None:
        """Give ``lease`` a free slot, or a place in the queue, or raise :class:`QueueFull`.

        A client coming back to a slot held for it is served first (or waits at the front while it drains).
        """
        returning = any(
            self._held_for(row, lease.client, now) or self._draining_for(row, lease.client) for row in self.rows
        )
        if returning or not self._queue:
            slot = self._free_slot(lease.client, now)
            if slot is not None:
                self._assign(slot, lease, now)
                return
        if returning:
            self._queue.appendleft(lease)
            self._renumber()
            return
        if len(self._queue) >= self.queue_size:
            raise QueueFull(
                f"all {len(self.rows)} conversation slots are busy and the waiting queue is full "
                f"({self.queue_size}); try again later"
            )
        self._queue.append(lease)
        lease.queued(len(self._queue))

    def release(self, lease: EngineLease, now: float, *, client_left: bool) -> None:
        """The session ended ``lease``: its slot drains before anyone else gets it (``client_left``, with others
        waiting: then the slot is held :data:`RETURN_WINDOW` for that client to come back)."""
        if lease in self._queue:
            self._queue.remove(lease)
            lease.given_back(False, None)
            self._renumber()
            return
        on_slot = lease.slot is not None and self.rows[lease.slot] is lease
        hold = client_left and lease.client is not None and bool(self._queue) and lease.state is not LeaseState.FAILED
        lease.given_back(on_slot, now + RETURN_WINDOW if hold else None)

    # -- between engine calls ------------------------------------------------

    def free_drained(self, now: float) -> list[int]:
        """Slots no engine call touches any more whose lease is gone: freed (or held); returns the rows the
        engine must reset.  Safe only while no engine call is in flight."""
        reset = []
        for i, lease in enumerate(self.rows):
            if lease is None:
                continue
            if lease.state is LeaseState.FAILED:  # (its session gives it back later: it stays FAILED till then)
                self.rows[i] = None
                reset.append(i)
                continue
            if lease.state is LeaseState.DRAINING:
                lease.drained(now)
                reset.append(i)
            if lease.state is LeaseState.HELD and now >= lease.held_until:
                lease.released()
            if lease.state is LeaseState.ENDED:
                self.rows[i] = None
        return reset

    def admit_waiting(self, now: float) -> None:
        """Hand free slots to the longest-waiting leases (a held slot only to its client)."""
        changed = False
        for lease in list(self._queue):
            slot = self._free_slot(lease.client, now)
            if slot is not None:
                self._queue.remove(lease)
                self._assign(slot, lease, now)
                changed = True
        if changed:
            self._renumber()

    def fail(self, slot: int, failure: LeaseFailure) -> None:
        """End the slot's conversation from the server's side (an engine error); its slot drains."""
        lease = self.rows[slot]
        if lease is not None:
            lease.fail(failure)

    # -- views ---------------------------------------------------------------

    def leases(self, states: frozenset[LeaseState]) -> list[tuple[int, EngineLease]]:
        """The slots whose lease is in one of ``states``, with it."""
        return [(i, lease) for i, lease in enumerate(self.rows) if lease is not None and lease.state in states]

    def live(self) -> list[EngineLease]:
        """The leases stepped every tick."""
        return [lease for lease in self.rows if lease is not None and lease.state in LIVE_STATES]

    def any_live(self) -> bool:
        """Whether any lease is stepped every tick (:meth:`live` without the list)."""
        return any(lease is not None and lease.state in LIVE_STATES for lease in self.rows)

    def ready(self) -> list[EngineLease]:
        """The leases whose prompt has run, waiting for their first step (READY)."""
        return [lease for lease in self.rows if lease is not None and lease.state is LeaseState.READY]

    def prompts_left(self) -> dict[int, int]:
        """Slots whose prompt runs: slot -> positions left."""
        return {i: lease.prompt_left for i, lease in self.leases(frozenset({LeaseState.PREFILL}))}

    @property
    def queued(self) -> int:
        """Leases waiting for a slot."""
        return len(self._queue)

    def slot_states(self, now: float) -> dict[str, int]:
        """How many slots are in each of :data:`SLOT_STATES` at ``now`` (a lapsed hold counts as free)."""
        counts = dict.fromkeys(SLOT_STATES, 0)
        for lease in self.rows:
            if lease is None or (lease.state is LeaseState.HELD and now >= lease.held_until):
                counts["free"] += 1
            else:
                counts[_SLOT_STATE[lease.state]] += 1
        return counts

    def free_count(self, now: float) -> int:
        """Slots that a newcomer could take now (held ones excluded)."""
        return self.slot_states(now)["free"]

    def busy(self) -> bool:
        """Anything waiting or running (a held or paused slot is neither)."""
        return bool(self._queue) or any(
            lease is not None and lease.state not in (LeaseState.HELD, LeaseState.PAUSED) for lease in self.rows
        )

    def next_change(self) -> float:
        """When the next hold lapses (inf: none does)."""
        return min(
            (lease.held_until for lease in self.rows if lease is not None and lease.state is LeaseState.HELD),
            default=math.inf,
        )

    # -- inside --------------------------------------------------------------

    def _free_slot(self, client: str | None, now: float) -> int | None:
        """A slot for ``client``: the one held for it first, else a free one, else one whose hold has lapsed."""
        for i, lease in enumerate(self.rows):
            if self._held_for(lease, client, now):
                return i
        free = [i for i, lease in enumerate(self.rows) if lease is None]
        if free:
            return free[0]
        return next(
            (
                i
                for i, lease in enumerate(self.rows)
                if lease is not None and lease.state is LeaseState.HELD and now >= lease.held_until
            ),
            None,
        )

    def _assign(self, slot: int, lease: EngineLease, now: float) -> None:
        held = self.rows[slot]
        if held is not None:
            held.released()  # its client came back, or its hold lapsed
        self.rows[slot] = lease
        lease.assigned(slot, now)

    def _renumber(self) -> None:
        for position, lease in enumerate(self._queue, start=1):
            if lease.position != position:
                lease.queued(position)

    @staticmethod
    def _held_for(lease: EngineLease | None, client: str | None, now: float) -> bool:
        return (
            lease is not None
            and client is not None
            and lease.state is LeaseState.HELD
            and lease.client == client
            and now < lease.held_until
        )

    @staticmethod
    def _draining_for(lease: EngineLease | None, client: str | None) -> bool:
        """A slot that will be held for ``client`` once it has drained."""
        return (
            lease is not None
            and client is not None
            and lease.state is LeaseState.DRAINING
            and lease.client == client
            and lease.held_until > 0
        )
