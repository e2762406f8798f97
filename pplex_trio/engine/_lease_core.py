"""What a lease's two ends share: its lifecycle, its state, and the reads both ends may make.

A lease is one conversation's claim on an engine slot.  Like Trio's memory
channels (two thin ends over one ``MemoryChannelState``), it is two ends over
one :class:`LeaseCore`: the session's :class:`~pplex_trio.engine._lease.Lease`
(push input, read output, flush, restart, end) and the engine's
:class:`~pplex_trio.engine._engine_lease.EngineLease` (assigned, started,
take a frame, deliver, fail, drained …).  Each end has only its own side's
methods, so a session that calls an engine-side method is a type error, not
a comment broken.  The core is moved only through :meth:`LeaseCore.move`, by
:data:`LEASE_LIFECYCLE`; the ends never write each other's fields.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

import trio

from .._channel import DropOldestChannel
from .._conversation import CloseCode, Conversation
from .._lifecycle import Lifecycle
from ._framing import InputFramer, InputStats
from ._outbox import OutputEnd, OutputEvent, carry_text, silent_frame


class LeaseState(enum.Enum):
    """Where a conversation stands in the engine (its moves: :data:`LEASE_LIFECYCLE`)."""

    QUEUED = "queued"  # waiting for a slot (``position`` in the queue)
    STARTING = "starting"  # has its slot; the engine starts its system prompt at the next engine call
    PREFILL = "prefill"  # its system prompt runs between ticks (``prompt_left`` positions to go)
    READY = "ready"  # its prompt has run; not stepped until its caller's first frame (or a timeout)
    LIVE = "live"  # one frame in and one out every tick
    PAUSED = "paused"  # its client's connection dropped: not stepped, its state kept for a resume (``held_until``)
    FLUSHING = "flushing"  # its input has ended: its output ends once every frame taken has its answer
    FLUSHED = "flushed"  # its ``OutputEnd`` is out; nothing follows
    FAILED = "failed"  # the server ended it (``failure`` says why); its slot drains
    DRAINING = "draining"  # the session gave it back; its slot is freed between engine calls
    HELD = "held"  # drained, its slot kept a moment for its client's return (see ``SlotTable``)
    ENDED = "ended"  # no slot, no place in the queue


S = LeaseState
LEASE_LIFECYCLE = Lifecycle(
    "lease",
    S.QUEUED,
    {
        S.QUEUED: {S.QUEUED, S.STARTING, S.ENDED},  # (QUEUED: a new position)
        S.STARTING: {S.PREFILL, S.READY, S.FLUSHING, S.FAILED, S.DRAINING},
        S.PREFILL: {S.STARTING, S.READY, S.FLUSHING, S.FAILED, S.DRAINING},  # (STARTING: the prompt again)
        S.READY: {S.STARTING, S.LIVE, S.PAUSED, S.FLUSHING, S.FAILED, S.DRAINING},
        S.LIVE: {S.STARTING, S.PAUSED, S.FLUSHING, S.FAILED, S.DRAINING},
        S.PAUSED: {S.LIVE, S.FAILED, S.DRAINING},  # (LIVE: resumed; DRAINING: its window lapsed)
        S.FLUSHING: {S.FLUSHED, S.FAILED, S.DRAINING},
        S.FLUSHED: {S.FAILED, S.DRAINING},
        S.FAILED: {S.DRAINING, S.ENDED},  # (ENDED: its slot was freed before the session gave it back)
        S.DRAINING: {S.HELD, S.ENDED},
        S.HELD: {S.ENDED},
        S.ENDED: set(),
    },
)
del S

PREPARING_STATES = frozenset({LeaseState.STARTING, LeaseState.PREFILL})  # has a slot, not live yet
LIVE_STATES = frozenset({LeaseState.LIVE, LeaseState.FLUSHING, LeaseState.FLUSHED})  # stepped every tick
BEGUN_STATES = LIVE_STATES | {LeaseState.READY}  # its prompt is behind it: the caller may talk
PAUSABLE_STATES = frozenset({LeaseState.READY, LeaseState.LIVE})  # a dropped connection may pause it
GONE_STATES = frozenset({LeaseState.DRAINING, LeaseState.HELD, LeaseState.ENDED})  # given back by the session


@dataclasses.dataclass(frozen=True)
class LeaseFailure:
    """Why the server ended a conversation: tell the client, then close with ``code``."""

    code: CloseCode
    message: str


class LeaseFailed(Exception):
    """Input for a conversation the server has ended; ``failure`` says why."""

    def __init__(self, failure: LeaseFailure):
        super().__init__(failure.message)
        self.failure = failure


class LeaseCore:
    """One lease's state, shared by its two ends (neither end is handed the other's methods).

    Its fields are the ends' to read and write, each its own side's; the
    state changes only through :meth:`move`, which wakes whoever waits.
    """

    def __init__(
        self,
        conversation: Conversation,
        *,
        framer: InputFramer,
        output_capacity: int,
        client: str | None,
        count_drop: Callable[[str, int], None],
    ):
        self.conversation = conversation
        self.client = client  # who asked (an address): a slot it leaves may be held for it (see SlotTable)
        self.framer = framer
        self.outbox: DropOldestChannel[OutputEvent] = DropOldestChannel(
            output_capacity,
            name="output_backlog",
            on_drop=lambda name: count_drop(name, 1),
            salvage=carry_text,
            drop_first=silent_frame,
        )
        self.state = LEASE_LIFECYCLE.start
        self.slot: int | None = None
        self.position = 0
        self.failure: LeaseFailure | None = None
        self.input_ended = False  # the client sent its last audio (a flush): nothing more is taken
        self.restarts = 0  # how often its prompt started again: an engine call planned before one is stale
        self.prompt_total = 0
        self.prompt_left = 0
        self.prompt_since = 0.0  # when its prompt last started waiting (STARTING)
        self.held_until = 0.0  # HELD or PAUSED: until when its slot waits for its client
        self.ready_since = 0.0  # when its prompt was done (READY: it waits for its caller's first frame)
        self.frames_consumed = 0  # real input frames the engine took
        self.frames_delivered = 0  # output frames put into the outbox
        self.output_skipped = 0  # the model's silent frames not sent, to get back to real time
        self.last_consumed_tick = -1
        self.last_delivered_tick = -1
        self.lot = trio.lowlevel.ParkingLot()

    def move(self, state: LeaseState, *, position: int = 0) -> None:
        """The one place a lease changes state (:class:`~pplex_trio._lifecycle.IllegalTransition` for a move its
        lifecycle does not have); whoever waits on it wakes."""
        self.state = LEASE_LIFECYCLE.move(self.state, state)
        self.position = position
        self.lot.unpark_all()

    def start_flushing(self) -> None:
        """The input has ended and the conversation is live: pad the last frame, and end the output once
        everything is answered (a flush from the session, or one kept until the prompt was done)."""
        self.framer.pad_to_frame()
        self.move(LeaseState.FLUSHING)
        self.end_output_if_flushed()

    def end_output_if_flushed(self) -> None:
        """FLUSHING with every frame taken answered: send ``OutputEnd`` (never dropped) and move to FLUSHED."""
        if (
            self.state is LeaseState.FLUSHING
            and not self.framer.pending_frames
            and self.last_delivered_tick >= self.last_consumed_tick
        ):
            self.outbox.send_nowait(OutputEnd(), droppable=False)
            self.move(LeaseState.FLUSHED)


class LeaseView:
    """What both ends read of their lease."""

    def __init__(self, core: LeaseCore):
        self._core = core

    @property
    def conversation(self) -> Conversation:
        """Its settings (the latest: a restart replaces them)."""
        return self._core.conversation

    @property
    def state(self) -> LeaseState:
        """Where the conversation stands in the engine."""
        return self._core.state

    @property
    def slot(self) -> int | None:
        """The slot it was given (kept after it is freed, for the record)."""
        return self._core.slot

    @property
    def position(self) -> int:
        """1-based place in the queue while QUEUED, else 0."""
        return self._core.position

    @property
    def failure(self) -> LeaseFailure | None:
        """Why the server ended it (FAILED), else None."""
        return self._core.failure

    @property
    def restarts(self) -> int:
        """How often its prompt started again (an engine call planned before a restart is stale)."""
        return self._core.restarts

    @property
    def frames_consumed(self) -> int:
        """Real input frames the engine took (silence fill excluded)."""
        return self._core.frames_consumed

    @property
    def frames_delivered(self) -> int:
        """Output frames put into the outbox (some may have been dropped since)."""
        return self._core.frames_delivered

    @property
    def output_dropped(self) -> int:
        """Output events dropped from its outbox for a reader that fell behind."""
        return self._core.outbox.dropped

    @property
    def output_skipped(self) -> int:
        """The model's silent frames a reader that fell behind was not sent (see ``_outbox.catch_up``)."""
        return self._core.output_skipped

    def input_stats(self) -> InputStats:
        """Its input framer's figures now (see :meth:`InputFramer.stats`)."""
        return self._core.framer.stats()
