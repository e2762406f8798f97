"""The engine actor's lifecycle (drawn in ``docs/ARCHITECTURE.md``): what its one engine call is doing.

The actor makes one engine call at a time (a tick, or work between ticks),
on a worker thread.  ``IDLE``: none is in flight.  ``CALLING``: one is.  A
call that raises ends its conversations and the engine is reset
(``RESETTING``).  A call that runs past ``engine_timeout`` is ``STALLED``:
its conversations end and new ones are refused, but it is still waited for
(no other call may start while it runs); when it returns, the engine is
reset (``RECOVERING``, still refusing), then the actor is ``IDLE`` again.
``/health`` reports the state; :attr:`ActorState.refuses` is what makes the
server unready.
"""

from __future__ import annotations

import dataclasses
import enum

from .._lifecycle import Lifecycle


class ActorState(enum.Enum):
    """What the actor's one engine call is doing (its moves: :data:`ACTOR_LIFECYCLE`)."""

    IDLE = "idle"  # no engine call in flight: waiting for a tick, planning, or nothing to do
    CALLING = "calling"  # an engine call (a tick or work between ticks) is on the worker thread
    RESETTING = "resetting"  # that call raised: its conversations ended, the engine is being reset
    STALLED = "stalled"  # that call has run past engine_timeout and is still waited for
    RECOVERING = "recovering"  # the stalled call returned: the engine is being reset

    @property
    def refuses(self) -> bool:
        """New conversations are refused (the engine stalled and is not back yet)."""
        return self in (ActorState.STALLED, ActorState.RECOVERING)


A = ActorState
ACTOR_LIFECYCLE = Lifecycle(
    "engine actor",
    A.IDLE,
    {
        A.IDLE: {A.CALLING},
        A.CALLING: {A.IDLE, A.RESETTING, A.STALLED},
        A.RESETTING: {A.IDLE},
        A.STALLED: {A.RECOVERING},
        A.RECOVERING: {A.IDLE},
    },
)


@dataclasses.dataclass(frozen=True)
class ActorStatistics:
    """What the actor holds, at one moment (``/health``, ``/metrics``): its slots, its queue, its ticks."""

    slots_total: int
    slots_free: int
    queued: int
    slots: dict[str, int]  # slots by state (``SLOT_STATES``)
    ticks: int
    ticks_skipped: int
    state: ActorState  # what its engine call is doing (``/health``'s ``engine_state``)
