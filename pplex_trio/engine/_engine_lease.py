"""The engine's end of a lease: what the slot table and the engine calls tell a conversation, and ask of it.

An :class:`EngineLease` is held by the actor, its
:class:`~pplex_trio.engine._slots.SlotTable`, its schedule and the engine
calls, never by a session (the session holds the other end,
:class:`~pplex_trio.engine._lease.Lease`; both share one
:class:`~pplex_trio.engine._lease_core.LeaseCore`).  Its methods run on the
Trio thread between engine calls and are synchronous.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np

from .._conversation import SAMPLE_RATE
from ._lease_core import GONE_STATES, LeaseCore, LeaseFailure, LeaseState, LeaseView
from ._outbox import OutputFrame

logger = logging.getLogger(__name__)

BEHIND_LOG_SECONDS = 10.0  # a conversation behind real time this long is logged (its caller does not pause)


class LeaseOwner(Protocol):
    """What a lease tells its engine actor, and asks of it (always naming the lease by its engine end)."""

    def clock(self) -> float:
        """The actor's clock (its schedule's), in seconds."""

    def input_arrived(self, lease: EngineLease, samples: int, arrived_at: float) -> None:
        """``samples`` of input arrived at ``arrived_at`` (0: the early audio kept during its prompt is now due)."""

    async def sleep_until_handshake(self, lease: EngineLease) -> None:
        """Sleep until the moment to send the session's handshake, just before one of the next ticks."""

    def lease_ended(self, lease: EngineLease, client_left: bool) -> None:
        """The session gave the lease back (``client_left``: the client left, so its slot may be held)."""

    def lease_paused(self, lease: LeaseView) -> float | None:
        """Its session lost its connection: park the lease (the session's end) for a resume; until when (the
        owner's clock), or None when it may not be paused (resuming is off): then it ends."""

    def lease_changed(self, lease: EngineLease) -> None:
        """The lease moved on the session's side (a restart, a begin): the actor has something to plan."""

    def count_drop(self, reason: str, count: int) -> None:
        """``count`` frames were dropped for ``reason`` (a backlog's name)."""

    def silence_skipped(self, direction: str, samples: int) -> None:
        """``samples`` of silence were skipped in ``direction`` (``input``/``output``) to catch up."""


class EngineLease(LeaseView):
    """The engine's side of one conversation's lease.

    ``on_frame`` observes the conversation's timeline: it is called with every
    frame the engine delivers, before the outbox (so a frame later dropped
    for a reader that fell behind is observed all the same), on the actor's
    task.  It must return at once and keep what it needs (a frame's ``text``
    may change afterwards: a dropped predecessor's piece rides on it).  One
    that raises is logged once and observes no more; the conversation goes on.
    """

    def __init__(self, core: LeaseCore, owner: LeaseOwner, on_frame: Callable[[OutputFrame], None] | None):
        super().__init__(core)
        self._owner = owner
        self._on_frame = on_frame
        self._behind_since: float | None = None  # since when its input is a frame or more behind real time
        self._behind_logged = False

    # -- what the engine reads -----------------------------------------------

    @property
    def client(self) -> str | None:
        """Who asked (an address): a slot it leaves may be held for it (see ``SlotTable``)."""
        return self._core.client

    @property
    def prompt_total(self) -> int:
        """Positions of its system prompt (the latest run of it)."""
        return self._core.prompt_total

    @property
    def prompt_left(self) -> int:
        """Positions of its system prompt still to run (PREFILL)."""
        return self._core.prompt_left

    @property
    def prompt_since(self) -> float:
        """When its prompt last began to wait for the engine (it entered STARTING)."""
        return self._core.prompt_since

    @property
    def held_until(self) -> float:
        """HELD: until when its slot waits for its client to come back (the actor's clock)."""
        return self._core.held_until

    @property
    def ready_since(self) -> float:
        """When its prompt was done (READY: it waits for its caller's first frame since then)."""
        return self._core.ready_since

    @property
    def last_input_arrival(self) -> float:
        """When its newest input arrived (-inf before any)."""
        return self._core.framer.last_arrival

    @property
    def input_behind(self) -> int:
        """Input samples beyond its usual backlog: how far behind real time the model hears it."""
        return self._core.framer.behind

    @property
    def has_input_frame(self) -> bool:
        """A whole input frame waits for the next tick."""
        return self._core.framer.pending_frames > 0

    @property
    def skips_silence_next(self) -> bool:
        """Behind real time with silence next: its next frame catches up (``InputFramer.skips_silence_next``)."""
        return self._core.framer.skips_silence_next

    @property
    def awaits_page(self) -> bool:
        """Aligned, streaming, and short of its next frame by no more than one page like its last."""
        return self._core.framer.awaits_page

    # -- what the slot table and the engine calls tell it, between engine calls ----------------------

    def queued(self, position: int) -> None:
        """Its place in the queue (1-based)."""
        self._core.move(LeaseState.QUEUED, position=position)

    def assigned(self, slot: int, now: float) -> None:
        """Given ``slot``: its prompt starts at the next engine call."""
        self._core.slot = slot
        self._core.prompt_since = now
        self._core.move(LeaseState.STARTING)

    def started(self, positions: int, now: float) -> bool:
        """The engine started its prompt: ``positions`` to run (0: done at once).  True when it is done."""
        self._core.prompt_total = self._core.prompt_left = positions
        if positions:
            self._core.move(LeaseState.PREFILL)
            return False
        self._prompt_done(now)
        return True

    def prefilled(self, positions: int, now: float) -> bool:
        """The engine ran ``positions`` of its prompt.  True when that was the last of it."""
        core = self._core
        core.prompt_left = max(0, core.prompt_left - positions)
        if core.prompt_left:
            return False
        self._prompt_done(now)
        return True

    def first_step(self) -> None:
        """A tick steps it for the first time (READY ──▶ LIVE): its caller's first frame is in, or the wait for
        it is over."""
        self._core.move(LeaseState.LIVE)

    def prompt_lost(self) -> None:
        """The engine was reset while the prompt ran: start it again (PREFILL ──▶ STARTING)."""
        self._core.restarts += 1
        self._core.move(LeaseState.STARTING)

    def take_frame(self, out: np.ndarray, tick: int, now: float) -> tuple[float | None, int]:
        """Move the next input frame into ``out`` (left alone when none waits), at ``now``.

        Returns when the frame's last sample arrived (None: no whole frame
        waited) and how many samples the aligned framer skipped on the way;
        silence skipped to catch up is told to the owner.
        """
        core, framer = self._core, self._core.framer
        skipped, caught_up = framer.skipped_samples, framer.caught_up_samples
        arrived = framer.pop_frame_into(out)
        if arrived is not None:
            core.frames_consumed += 1
            core.last_consumed_tick = tick
        if framer.caught_up_samples != caught_up:
            self._owner.silence_skipped("input", framer.caught_up_samples - caught_up)
        self._note_lag(now)
        return arrived, framer.skipped_samples - skipped

    def deliver(self, frame: OutputFrame) -> None:
        """A tick's output; nothing follows the end of a flushed conversation's output."""
        core = self._core
        if core.state is LeaseState.FLUSHED:
            return
        if self._on_frame is not None:
            self._observe(frame)
        core.outbox.send_nowait(frame)
        core.frames_delivered += 1
        core.last_delivered_tick = frame.tick
        core.end_output_if_flushed()  # (output alone wakes only the send task, through the outbox)

    def fail(self, failure: LeaseFailure) -> None:
        """The server ends the conversation (an engine error, a stall); a second failure changes nothing."""
        if self._core.state in (LeaseState.FAILED, *GONE_STATES):
            return
        self._core.failure = failure
        self._core.move(LeaseState.FAILED)

    def paused(self, until: float) -> None:
        """Its client's connection dropped: not stepped (its state stays) until it resumes or ``until``."""
        self._core.held_until = until
        self._core.move(LeaseState.PAUSED)

    def resumed(self, on_frame: Callable[[OutputFrame], None] | None) -> None:
        """A new connection took it over: stepped again from the next tick, its input afresh (nothing of the
        outage is replayed or caught up with), ``on_frame`` its new observer."""
        core = self._core
        core.held_until = 0.0
        core.framer = core.framer.renewed()
        self._on_frame = on_frame
        self._behind_since, self._behind_logged = None, False
        core.move(LeaseState.LIVE)

    def given_back(self, on_slot: bool, held_until: float | None) -> None:
        """The session ended it: its slot drains (``held_until``: then waits for its client until then), or,
        with no slot to drain, it is over."""
        core = self._core
        core.held_until = held_until or 0.0
        core.move(LeaseState.DRAINING if on_slot else LeaseState.ENDED)
        core.outbox.close()

    def drained(self, now: float) -> None:
        """No engine call touches its slot any more: held for its client, or over."""
        held = now < self._core.held_until
        self._core.move(LeaseState.HELD if held else LeaseState.ENDED)

    def released(self) -> None:
        """Its slot went to someone else (the hold is over, or its client came back): it is over."""
        self._core.move(LeaseState.ENDED)

    # -- inside --------------------------------------------------------------

    def _prompt_done(self, now: float) -> None:
        core, framer = self._core, self._core.framer
        core.ready_since = now
        if framer.catch_up():
            self._owner.input_arrived(self, 0, framer.last_arrival)
        if core.input_ended:
            core.start_flushing()
        else:
            core.move(LeaseState.READY)

    def _note_lag(self, now: float) -> None:
        """A conversation that stays behind real time (its caller has not paused for it to catch up) is said
        once, and again when it is back."""
        framer, slot = self._core.framer, self._core.slot
        if framer.behind >= framer.frame_size:
            if self._behind_since is None:
                self._behind_since = now
            elif not self._behind_logged and now - self._behind_since >= BEHIND_LOG_SECONDS:
                self._behind_logged = True
                logger.info(
                    "slot %s: %.2f s behind real time for %g s: its caller has not paused for the lag to be "
                    "caught up with",
                    slot,
                    framer.behind / SAMPLE_RATE,
                    BEHIND_LOG_SECONDS,
                )
        elif self._behind_since is not None:
            if self._behind_logged:
                logger.info("slot %s: back to real time after %.1f s", slot, now - self._behind_since)
            self._behind_since, self._behind_logged = None, False

    def stop_observing(self) -> None:
        """The conversation has ended (the session's end says so): its observer is let go."""
        self._on_frame = None

    def _observe(self, frame: OutputFrame) -> None:
        """Tell ``on_frame``; one that fails is let go, never the conversation."""
        assert self._on_frame is not None
        try:
            self._on_frame(frame)
        except Exception:
            self._on_frame = None
            logger.exception(
                "slot %s: the observer of its frames failed; it is let go and the conversation goes on", self._core.slot
            )
