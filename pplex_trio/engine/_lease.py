"""A lease: one conversation's claim on an engine slot, and its whole life in the engine.

A :class:`Lease` is the session's handle (it pushes input, reads output,
flushes, restarts, ends) and the one record of where its conversation
stands (:class:`LeaseState`, moved only by the lease's own methods through
:data:`LEASE_LIFECYCLE`).  The :class:`~pplex_trio.engine._slots.SlotTable`
and the engine calls ask it and tell it (``assigned``, ``started``,
``take_frame``, ``deliver``, ``fail``, ``drained`` …: the engine's side,
called only between engine calls); they never write its fields.  A slot's
state is its lease's (or free: no lease).  Everything runs on the Trio
thread and is synchronous, except waiting.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np
import trio

from .._channel import DropOldestChannel
from .._conversation import SAMPLE_RATE, CloseCode, Conversation
from .._lifecycle import Lifecycle
from ._framing import InputFramer, InputStats
from ._outbox import OutputBatches, OutputEnd, OutputEvent, OutputFrame, carry_text, silent_frame


logger = logging.getLogger(__name__)

BEHIND_LOG_SECONDS = 10.0  # a conversation behind real time this long is logged (its caller does not pause)


class LeaseState(enum.Enum):
    """Where a conversation stands in the engine (its moves: :data:`LEASE_LIFECYCLE`)."""

    QUEUED = "queued"  # waiting for a slot (``position`` in the queue)
    STARTING = "starting"  # has its slot; the engine starts its system prompt at the next engine call
    PREFILL = "prefill"  # its system prompt runs between ticks (``prompt_left`` positions to go)
    READY = "ready"  # its prompt has run; not stepped until its caller's first frame (or a timeout)
    LIVE = "live"  # one frame in and one out every tick
    FLUSHING = "flushing"  # its input has ended: its output ends once every frame taken has its answer
    FLUSHED = "flushed"  # its ``OutputEnd`` is out; nothing follows
    FAILED = "failed"  # the server ended it (``failure`` says why); its slot drains
    DRAINING = "draining"  # the session gave it back; its slot is freed between engine calls
    HELD = "held"  # drained, its slot kept a moment for its client's return (see ``SlotTable``)
    ENDED = "ended"  # no slot, no place in the queue


S = LeaseState
LEASE_LIFECYCLE = Lifecycle("lease", S.QUEUED, {
    S.QUEUED: {S.QUEUED, S.STARTING, S.ENDED},  # (QUEUED: a new position)
    S.STARTING: {S.PREFILL, S.READY, S.FLUSHING, S.FAILED, S.DRAINING},
    S.PREFILL: {S.STARTING, S.READY, S.FLUSHING, S.FAILED, S.DRAINING},  # (STARTING: the prompt again)
    S.READY: {S.STARTING, S.LIVE, S.FLUSHING, S.FAILED, S.DRAINING},
    S.LIVE: {S.STARTING, S.FLUSHING, S.FAILED, S.DRAINING},
    S.FLUSHING: {S.FLUSHED, S.FAILED, S.DRAINING},
    S.FLUSHED: {S.FAILED, S.DRAINING},
    S.FAILED: {S.DRAINING, S.ENDED},  # (ENDED: its slot was freed before the session gave it back)
    S.DRAINING: {S.HELD, S.ENDED},
    S.HELD: {S.ENDED},
    S.ENDED: set(),
})
del S

PREPARING_STATES = frozenset({LeaseState.STARTING, LeaseState.PREFILL})  # has a slot, not live yet
LIVE_STATES = frozenset({LeaseState.LIVE, LeaseState.FLUSHING, LeaseState.FLUSHED})  # stepped every tick
BEGUN_STATES = LIVE_STATES | {LeaseState.READY}  # its prompt is behind it: the caller may talk
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


class LeaseOwner(Protocol):
    """What a lease tells its engine actor, and asks of it."""

    def input_arrived(self, lease: Lease, samples: int, arrived_at: float) -> None: ...
    async def sleep_until_handshake(self, lease: Lease) -> None: ...
    def lease_ended(self, lease: Lease, client_left: bool) -> None: ...
    def lease_changed(self, lease: Lease) -> None: ...
    def count_drop(self, reason: str, count: int) -> None: ...
    def silence_skipped(self, direction: str, samples: int) -> None: ...


class Lease:
    """One conversation's claim on an engine slot.

    The session reads ``state``, ``position`` (in the queue) and ``failure``,
    and waits for any of them to change with :meth:`wait_changed`; pushes input
    with :meth:`push_input`; reads output with ``async for batch in
    lease.frames()``; :meth:`flush` asks for an :class:`OutputEnd` once every
    pending input frame has had its answer; :meth:`restart` runs the system
    prompt again with new settings; :meth:`end` gives the slot back.

    ``on_frame`` observes the conversation's timeline: it is called with every
    frame the engine delivers, before the outbox (so a frame later dropped
    for a reader that fell behind is observed all the same), on the actor's
    task.  It must return at once and keep what it needs (a frame's ``text``
    may change afterwards: a dropped predecessor's piece rides on it).  One
    that raises is logged once and observes no more; the conversation goes on.
    """

    def __init__(self, conversation: Conversation, owner: LeaseOwner, *, framer: InputFramer,
                 output_capacity: int, early_audio: bool = False, client: str | None = None,
                 on_frame: Callable[[OutputFrame], None] | None = None):
        self.conversation = conversation
        self.client = client  # who asked (an address): a slot it leaves may be held for it (see SlotTable)
        self._owner = owner
        self._on_frame = on_frame
        self._framer = framer
        self._early_audio = early_audio
        self._outbox: DropOldestChannel[OutputEvent] = DropOldestChannel(
            output_capacity, name="output_backlog", on_drop=lambda name: owner.count_drop(name, 1),
            salvage=carry_text, drop_first=silent_frame)
        self._output_skipped = 0  # the model's silent frames not sent, to get back to real time
        self._state = LEASE_LIFECYCLE.start
        self._slot: int | None = None
        self._position = 0
        self._failure: LeaseFailure | None = None
        self._restarts = 0  # how often its prompt started again: an engine call planned before one is stale
        self._prompt_total = 0
        self._prompt_left = 0
        self._prompt_since = 0.0  # when its prompt last started waiting (STARTING)
        self._held_until = 0.0  # HELD: until when its slot waits for its client
        self._ready_since = 0.0  # when its prompt was done (READY: it waits for its caller's first frame)
        self._frames_consumed = 0  # real input frames the engine took
        self._frames_delivered = 0  # output frames put into the outbox
        self._last_consumed_tick = -1
        self._last_delivered_tick = -1
        self._behind_since: float | None = None  # since when its input is a frame or more behind real time
        self._behind_logged = False
        self._overflow_logged = False
        self._lot = trio.lowlevel.ParkingLot()

    # -- what the session reads ----------------------------------------------

    @property
    def state(self) -> LeaseState:
        return self._state

    @property
    def slot(self) -> int | None:
        """The slot it was given (kept after it is freed, for the record)."""
        return self._slot

    @property
    def position(self) -> int:
        """1-based place in the queue while QUEUED, else 0."""
        return self._position

    @property
    def failure(self) -> LeaseFailure | None:
        return self._failure

    @property
    def prompt_total(self) -> int:
        """Positions of its system prompt (the latest run of it)."""
        return self._prompt_total

    @property
    def prompt_left(self) -> int:
        return self._prompt_left

    @property
    def restarts(self) -> int:
        return self._restarts

    @property
    def prompt_since(self) -> float:
        """When its prompt last began to wait for the engine (it entered STARTING)."""
        return self._prompt_since

    @property
    def held_until(self) -> float:
        return self._held_until

    @property
    def ready_since(self) -> float:
        return self._ready_since

    @property
    def frames_consumed(self) -> int:
        """Real input frames the engine took (silence fill excluded)."""
        return self._frames_consumed

    @property
    def frames_delivered(self) -> int:
        """Output frames put into the outbox (some may have been dropped since)."""
        return self._frames_delivered

    @property
    def output_dropped(self) -> int:
        return self._outbox.dropped

    @property
    def output_skipped(self) -> int:
        """The model's silent frames a reader that fell behind was not sent (see ``_outbox.catch_up``)."""
        return self._output_skipped

    @property
    def last_input_arrival(self) -> float:
        """When its newest input arrived (-inf before any)."""
        return self._framer.last_arrival

    @property
    def input_behind(self) -> int:
        """Input samples beyond its usual backlog: how far behind real time the model hears it."""
        return self._framer.behind

    @property
    def has_input_frame(self) -> bool:
        """A whole input frame waits for the next tick."""
        return self._framer.pending_frames > 0

    @property
    def awaits_page(self) -> bool:
        """Aligned, streaming, and short of its next frame by no more than one page like its last."""
        return self._framer.awaits_page

    @property
    def early_audio_kept(self) -> bool:
        """Whether audio pushed before LIVE waits for the model (see :meth:`push_input`)."""
        return self._framer.early_samples > 0

    def input_stats(self) -> InputStats:
        return self._framer.stats()

    async def wait_changed(self) -> None:
        """Wait until state, position or failure changes (output is read from :meth:`frames`)."""
        await self._lot.park()

    # -- what the session does -----------------------------------------------

    def push_input(self, pcm: np.ndarray, arrived_at: float) -> bool:
        """Queue input PCM that reached the server at ``arrived_at``; False when it is dropped.

        Before LIVE, a lease made with ``early_audio`` keeps the last few
        seconds of it for the model (queued ahead of the live audio when the
        conversation goes live; see ``InputFramer.keep_early``); otherwise
        input before LIVE is audio the model was never going to hear (the
        client should wait for the handshake).  On overflow the oldest frames
        go.  After a flush nothing is taken.

        Error handling: :class:`LeaseFailed` for a FAILED lease.
        """
        if self._state is LeaseState.FAILED:
            assert self._failure is not None
            raise LeaseFailed(self._failure)
        if self._framer.input_ended or self._state in GONE_STATES:
            return False
        if self._state not in (LeaseState.READY, LeaseState.LIVE):
            if not self._early_audio:
                return False
            self._count_overflow(self._framer.keep_early(pcm, arrived_at))
            return True
        self._count_overflow(self._framer.push(pcm, arrived_at))
        self._owner.input_arrived(self, pcm.size, arrived_at)
        return True

    def flush(self) -> None:
        """No more input: pad the last frame, and end the output once everything is answered (a flush before
        LIVE takes effect when the conversation goes live)."""
        if self._framer.input_ended:
            return
        self._framer.input_ended = True
        if self._state in (LeaseState.READY, LeaseState.LIVE):
            self._start_flushing()

    def frames(self) -> OutputBatches:
        """Output events, in batches of everything waiting (at least one); ends when the lease does."""
        return OutputBatches(self._outbox, self._skipped_output)

    async def sleep_until_handshake(self) -> None:
        """Sleep until the moment to send the handshake: just before one of the next ticks, by the lead the
        clients need (see ``TickSchedule.sleep_until_handshake``); the first page after it is timed."""
        await self._owner.sleep_until_handshake(self)

    def restart(self, conversation: Conversation) -> bool:
        """Run the system prompt again with ``conversation`` (its persona, voice, sampling) in the same slot:
        a persona change without leaving.  What the client says meanwhile is kept for the model as before its
        first handshake (``early_audio``).  False when it is too late (the input has ended, or the
        conversation is over)."""
        if self._state is LeaseState.QUEUED:
            self.conversation = conversation  # nothing has run yet
            return True
        if self._state not in (LeaseState.STARTING, LeaseState.PREFILL, LeaseState.READY, LeaseState.LIVE) \
                or self._framer.input_ended:
            return False
        if self._state in (LeaseState.READY, LeaseState.LIVE):
            self._framer.back_to_early()
        self.conversation = conversation
        self._restarts += 1  # an engine call in flight for the old settings no longer counts
        if self._state is not LeaseState.STARTING:
            self._prompt_since = trio.current_time()
            self._move(LeaseState.STARTING)
        self._owner.lease_changed(self)
        return True

    def begin(self) -> None:
        """Step it from the next tick on without waiting for its caller's first frame (the caller asked the
        model to speak first: a Realtime ``response.create``)."""
        if self._state is LeaseState.READY:
            self._move(LeaseState.LIVE)
            self._owner.lease_changed(self)

    def end(self, *, client_left: bool = False) -> None:
        """The conversation is over: give the slot back (it drains before anyone else gets it).

        ``client_left``: it ended because the client left (not by the server's doing), so the slot may be held
        a moment for the same client to come back (a persona change).
        """
        # Nothing is observed after the end; the observer is the session's (its bound method), and a lease
        # that kept it would keep a cycle with the session, its socket and its backlogs, for the collector
        # the server runs rarely (see serve's _quiet_garbage_collector): ~0.5 MB per conversation, held.
        self._on_frame = None
        if self._state not in GONE_STATES:
            self._owner.lease_ended(self, client_left)

    # -- the engine's side: the slot table and the engine calls, between engine calls ---------------

    def queued(self, position: int) -> None:
        """Its place in the queue (1-based)."""
        self._move(LeaseState.QUEUED, position=position)

    def assigned(self, slot: int, now: float) -> None:
        """Given ``slot``: its prompt starts at the next engine call."""
        self._slot = slot
        self._prompt_since = now
        self._move(LeaseState.STARTING)

    def started(self, positions: int, now: float) -> bool:
        """The engine started its prompt: ``positions`` to run (0: done at once).  True when it is done."""
        self._prompt_total = self._prompt_left = positions
        if positions:
            self._move(LeaseState.PREFILL)
            return False
        self._prompt_done(now)
        return True

    def prefilled(self, positions: int, now: float) -> bool:
        """The engine ran ``positions`` of its prompt.  True when that was the last of it."""
        self._prompt_left = max(0, self._prompt_left - positions)
        if self._prompt_left:
            return False
        self._prompt_done(now)
        return True

    def first_step(self) -> None:
        """A tick steps it for the first time (READY ──▶ LIVE): its caller's first frame is in, or the wait for
        it is over."""
        self._move(LeaseState.LIVE)

    def prompt_lost(self) -> None:
        """The engine was reset while the prompt ran: start it again (PREFILL ──▶ STARTING)."""
        self._restarts += 1
        self._move(LeaseState.STARTING)

    def take_frame(self, out: np.ndarray, tick: int, now: float) -> tuple[float | None, int]:
        """Move the next input frame into ``out`` (left alone when none waits), at ``now``.

        Returns when the frame's last sample arrived (None: no whole frame
        waited) and how many samples the aligned framer skipped on the way;
        silence skipped to catch up is told to the owner.
        """
        framer = self._framer
        skipped, caught_up = framer.skipped_samples, framer.caught_up_samples
        arrived = framer.pop_frame_into(out)
        if arrived is not None:
            self._frames_consumed += 1
            self._last_consumed_tick = tick
        if framer.caught_up_samples != caught_up:
            self._owner.silence_skipped("input", framer.caught_up_samples - caught_up)
        self._note_lag(now)
        return arrived, framer.skipped_samples - skipped

    def deliver(self, frame: OutputFrame) -> None:
        """A tick's output; nothing follows the end of a flushed conversation's output."""
        if self._state is LeaseState.FLUSHED:
            return
        if self._on_frame is not None:
            self._observe(frame)
        self._outbox.send_nowait(frame)
        self._frames_delivered += 1
        self._last_delivered_tick = frame.tick
        self._end_output_if_flushed()  # (output alone wakes only the send task, through the outbox)

    def fail(self, failure: LeaseFailure) -> None:
        """The server ends the conversation (an engine error, a stall); a second failure changes nothing."""
        if self._state in (LeaseState.FAILED, *GONE_STATES):
            return
        self._failure = failure
        self._move(LeaseState.FAILED)

    def given_back(self, on_slot: bool, held_until: float | None) -> None:
        """The session ended it: its slot drains (``held_until``: then waits for its client until then), or,
        with no slot to drain, it is over."""
        self._held_until = held_until or 0.0
        if self._state is LeaseState.QUEUED:
            self._position = 0
        self._move(LeaseState.DRAINING if on_slot else LeaseState.ENDED)
        self._outbox.close()

    def drained(self, now: float) -> None:
        """No engine call touches its slot any more: held for its client, or over."""
        held = now < self._held_until
        self._move(LeaseState.HELD if held else LeaseState.ENDED)

    def released(self) -> None:
        """Its slot went to someone else (the hold is over, or its client came back): it is over."""
        self._move(LeaseState.ENDED)

    # -- inside --------------------------------------------------------------

    def _count_overflow(self, frames: int) -> None:
        """Input beyond the backlog: the oldest frames went (counted; said once a conversation)."""
        if not frames:
            return
        self._owner.count_drop("input_backlog", frames)
        if not self._overflow_logged:
            self._overflow_logged = True
            logger.info("slot %s: more input came at once than its backlog holds; the oldest %d frame(s) were "
                        "dropped (--input-backlog-seconds)", self._slot, frames)

    def _note_lag(self, now: float) -> None:
        """A conversation that stays behind real time (its caller has not paused for it to catch up) is said
        once, and again when it is back."""
        if self._framer.behind >= self._framer.frame_size:
            if self._behind_since is None:
                self._behind_since = now
            elif not self._behind_logged and now - self._behind_since >= BEHIND_LOG_SECONDS:
                self._behind_logged = True
                logger.info("slot %s: %.2f s behind real time for %g s: its caller has not paused for the lag to be "
                            "caught up with", self._slot, self._framer.behind / SAMPLE_RATE, BEHIND_LOG_SECONDS)
        elif self._behind_since is not None:
            if self._behind_logged:
                logger.info("slot %s: back to real time after %.1f s", self._slot, now - self._behind_since)
            self._behind_since, self._behind_logged = None, False

    def _observe(self, frame: OutputFrame) -> None:
        """Tell ``on_frame``; one that fails is let go, never the conversation."""
        assert self._on_frame is not None
        try:
            self._on_frame(frame)
        except Exception:
            self._on_frame = None
            logger.exception("slot %s: the observer of its frames failed; it is let go and the conversation goes on",
                             self._slot)

    def _skipped_output(self, frames: int) -> None:
        self._output_skipped += frames
        self._owner.silence_skipped("output", frames * self._framer.frame_size)

    def _prompt_done(self, now: float) -> None:
        self._ready_since = now
        if self._framer.catch_up():
            self._owner.input_arrived(self, 0, self._framer.last_arrival)
        if self._framer.input_ended:
            self._start_flushing()
        else:
            self._move(LeaseState.READY)

    def _start_flushing(self) -> None:
        self._framer.pad_to_frame()
        self._move(LeaseState.FLUSHING)
        self._end_output_if_flushed()

    def _end_output_if_flushed(self) -> None:
        if (self._state is LeaseState.FLUSHING and not self._framer.pending_frames
                and self._last_delivered_tick >= self._last_consumed_tick):
            self._outbox.send_nowait(OutputEnd(), droppable=False)
            self._move(LeaseState.FLUSHED)

    def _move(self, state: LeaseState, *, position: int = 0) -> None:
        """The one place a lease changes state (:class:`~pplex_trio._lifecycle.IllegalTransition` for a move its
        lifecycle does not have); whoever waits on it wakes."""
        self._state = LEASE_LIFECYCLE.move(self._state, state)
        self._position = position
        self._lot.unpark_all()
