"""EngineActor: the one task that owns the engine and drives the lockstep.

While a conversation is live it runs **one** batched step over all slots
every tick (Trio clock), and between those ticks the work the conversations
and the server asked of the engine: the joining conversations' system
prompts, then jobs such as voices made from recordings, sized to the time
left before the next tick (``_work.py``); with nobody live it runs that work
back to back.  Every engine call goes to a worker thread, with a capacity
limiter of one: the engine is not thread-safe and a GPU call must never run
twice at once.  Sessions never call the engine; they hold a
:class:`~pplex_trio.engine.Lease` and exchange frames through it.

When a tick starts, what waits for it and how much time is free between
ticks is the :class:`~pplex_trio.engine._schedule.TickSchedule`'s to say;
who has which slot, the :class:`~pplex_trio.engine._slots.SlotTable`'s; what
one engine call does is in ``_engine_call``.

**Faults.**  An engine call that raises ends the conversations it involved
(1011) and the engine is reset: every other conversation on it loses its
state too (a prompt in progress starts again; a live one ends).  One that
hangs past ``engine_timeout`` ends its conversations as well and marks the
actor *stalled* (``/health`` says so and new conversations are refused),
but is still waited for: the engine is not thread-safe, so no other call
may start; when it returns, the engine is reset and the actor goes on.
Where the actor stands is one :class:`~pplex_trio.engine._actor_state.ActorState`
(``ACTOR_LIFECYCLE``).

**Time.**  The schedule's clock is the actor's only clock
(:meth:`TickSchedule.now`, :meth:`TickSchedule.sleep_until`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import trio

from .._conversation import CloseCode, Conversation
from .._metrics import Metrics
from ._actor_state import ACTOR_LIFECYCLE, ActorState, ActorStatistics
from ._engine_call import CallResult, EngineCall, apply_result, execute, fail_call, plan_call, plan_tick
from ._engine_lease import EngineLease
from ._framing import InputFramer
from ._interface import Engine, Job
from ._lease import Lease, open_lease
from ._lease_core import LeaseFailure, LeaseState, LeaseView
from ._outbox import OutputFrame
from ._resume import ResumeBook
from ._schedule import TickSchedule
from ._settings import ActorSettings
from ._slots import SlotTable
from ._work import BetweenTicks

logger = logging.getLogger(__name__)


class EngineActor:
    """Owns ``engine``; sessions get slots through :meth:`lease`, jobs run through :meth:`run_job`."""

    def __init__(self, engine: Engine, settings: ActorSettings | None = None, *, metrics: Metrics | None = None):
        self.engine = engine
        self.settings = settings = settings or ActorSettings()
        self.metrics = metrics or Metrics()
        self.table = SlotTable(engine.num_slots, queue_size=settings.queue_size)
        self.schedule = schedule = TickSchedule(self.table, settings)
        self.work = BetweenTicks(starved_ticks=schedule.in_ticks(settings.work_starved))
        self._limiter = trio.CapacityLimiter(1)
        self._wakeup = trio.Event()
        self._pcm = np.zeros((engine.num_slots, engine.frame_size), dtype=np.float32)
        self.state = ACTOR_LIFECYCLE.start
        self.resumes = ResumeBook(settings.resume_seconds, self.clock, self.metrics)  # paused conversations
        self._set_slot_gauges(self.table.slot_states(now=0.0))  # (no lease yet: the time does not matter)

    # -- sessions ------------------------------------------------------------

    @contextlib.contextmanager
    def lease(
        self,
        conversation: Conversation,
        *,
        align: bool = False,
        early_audio: bool = False,
        client: str | None = None,
        on_frame: Callable[[OutputFrame], None] | None = None,
    ) -> Iterator[Lease]:
        """Claim a slot (or a place in the queue) for the duration of the block.

        ``align`` asks for phase-aligned framing of this conversation's input
        (lower latency; may skip a few ms of audio once to catch up, see
        :class:`InputFramer`); ``early_audio`` keeps what the client says
        before the conversation is live for the model (see
        :meth:`Lease.push_input`); ``client`` (an address) names who asks, for
        the slot held for a client that left (see :class:`SlotTable`);
        ``on_frame`` observes every frame delivered to it (see :class:`EngineLease`).  Raises
        :class:`QueueFull` at once if there is neither a slot nor a place in the
        queue.  On exit the slot drains: it is freed only between engine calls.
        """
        s, ticks = self.settings, self.schedule.in_ticks  # (one frame in, one out, per tick)
        framer = InputFramer(
            self.engine.frame_size,
            ticks(s.input_backlog_seconds),
            align=align,
            window=ticks(s.framer_window),
            hold_after_underrun=ticks(s.framer_hold),
        )
        lease, engine_end = open_lease(
            conversation,
            self,
            framer=framer,
            output_capacity=ticks(s.output_backlog_seconds),
            early_audio=early_audio,
            client=client,
            on_frame=on_frame,
        )
        self.table.request(engine_end, self.schedule.now())
        self._changed()
        try:
            yield lease
        finally:
            lease.end()

    @property
    def stalled(self) -> bool:
        """An engine call ran past ``engine_timeout`` and the engine is not back yet: refuse new conversations."""
        return self.state.refuses

    # What a lease tells its actor (LeaseOwner).

    def clock(self) -> float:
        """The actor's clock (its schedule's: Trio's, or a test's), in seconds."""
        return self.schedule.now()

    def input_arrived(self, lease: EngineLease, samples: int, arrived_at: float) -> None:
        """``samples`` of ``lease``'s input arrived at ``arrived_at``: the schedule notes it; an idle actor wakes."""
        self.schedule.input_arrived(lease, samples, arrived_at)
        if lease.state is LeaseState.READY and not self.schedule.running:
            self._wakeup.set()  # its first frame may be in: an idle actor starts a grid for it

    async def sleep_until_handshake(self, lease: EngineLease) -> None:
        """Sleep until the moment ``lease``'s session sends its handshake (see ``TickSchedule``)."""
        await self.schedule.sleep_until_handshake(lease)

    def lease_ended(self, lease: EngineLease, client_left: bool) -> None:
        """The session gave ``lease`` back: its slot drains (held a moment when ``client_left``)."""
        self.table.release(lease, self.schedule.now(), client_left=client_left)
        self.schedule.forget(lease)
        self._changed()

    def lease_paused(self, lease: LeaseView) -> float | None:
        """``lease``'s connection dropped: parked under its token until when (None: it has none, so it ends)."""
        until = self.resumes.park(lease)
        self._changed()
        return until

    def lease_changed(self, lease: EngineLease) -> None:
        """``lease`` moved (a restart, a begin): the actor wakes to plan for it."""
        self._changed()

    def count_drop(self, reason: str, count: int) -> None:
        """Count ``count`` frames dropped for ``reason`` (a backlog's name) in the metrics."""
        self.metrics.drop(reason, count)

    def silence_skipped(self, direction: str, samples: int) -> None:
        """Count ``samples`` of silence skipped in ``direction`` (``input``/``output``) to get back to real time."""
        self.metrics.silence_skipped.labels(direction).inc(samples / self.engine.sample_rate)

    @property
    def ticks(self) -> int:
        """Ticks run so far."""
        return self.schedule.ticks

    @property
    def ticks_skipped(self) -> int:
        """Ticks skipped so far to catch up with the grid after a late one."""
        return self.schedule.ticks_skipped

    def statistics(self) -> ActorStatistics:
        """A frozen snapshot of the slots, the queue, the ticks and the state, now."""
        slots = self.table.slot_states(self.schedule.now())
        return ActorStatistics(
            slots_total=len(self.table.rows),
            slots_free=slots["free"],
            queued=self.table.queued,
            slots=slots,
            ticks=self.ticks,
            ticks_skipped=self.ticks_skipped,
            state=self.state,
        )

    # -- jobs between ticks ------------------------------------------------------

    async def run_job(self, job: Job) -> bytes:
        """Run ``job`` between ticks, after the joining conversations' prompts (a live conversation's tick
        never waits for it), one job at a time, in the order asked; returns what it made.

        Error handling: the job's own exception when it fails, ``RuntimeError``
        when the engine failed while running it; cancelling the caller drops
        the job (a call already running finishes its frames).
        """
        pending = self.work.submit(job, self.schedule.ticks)
        self._changed()
        try:
            await pending.done.wait()
        finally:
            self.work.withdraw(pending)
        if isinstance(pending.outcome, Exception):
            raise pending.outcome
        assert pending.outcome is not None
        return pending.outcome

    @property
    def jobs_waiting(self) -> int:
        """Jobs asked for and not done yet (the one running included)."""
        return len(self.work.jobs)

    # -- the loop ------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick while a conversation is live, run the work between ticks; idle while there is nothing to do."""
        task_status.started()
        schedule = self.schedule
        while True:
            self.resumes.lapse_due()
            if schedule.wants_tick():
                schedule.start_grid()
                await self._tick()
            else:
                schedule.stop()
            await self._between_ticks()
            if not schedule.wants_tick() and not self._work_waiting():
                schedule.stop()  # (the next conversation to step gets a fresh grid)
                self._wakeup = trio.Event()
                # (a held slot's hold lapses, a READY conversation's wait for its first frame ends)
                with trio.move_on_at(
                    min(self.table.next_change(), self.resumes.next_lapse(), schedule.next_first_step())
                ):
                    await self._wakeup.wait()  # nothing to run until a conversation, a frame or a job comes
            await trio.lowlevel.checkpoint()

    def _work_waiting(self) -> bool:
        """Something between ticks could run now (a slot to free or fill, a prompt, a job)."""
        table = self.table
        return bool(
            table.leases(frozenset({LeaseState.STARTING, LeaseState.PREFILL, LeaseState.DRAINING, LeaseState.FAILED}))
            or self.work.jobs
            or (table.queued and table.free_count(self.schedule.now()))
        )

    async def _tick(self) -> None:
        schedule, metrics = self.schedule, self.metrics
        start = await schedule.wait_for_tick()
        metrics.tick_lateness.observe(start.late)
        if start.early:
            metrics.tick_early.observe(start.early)
        if start.held is not None:
            metrics.tick_input_wait.observe(start.held)
        began = schedule.now()
        call = plan_call(self.table, began)
        plan_tick(self.table, call, schedule.ticks, self._pcm, start.first_steps, metrics)
        assert call.tick is not None
        await self._run_call(call)
        metrics.tick_duration.observe(schedule.now() - began)
        skipped = schedule.tick_done(list(call.tick.arrivals.values()), began)
        if skipped:
            metrics.ticks_skipped.inc(skipped)
            logger.warning("engine actor fell %d tick(s) behind; skipping ahead", skipped)
        self._update_gauges()

    async def _between_ticks(self) -> None:
        """Resets, starts, system prompts and jobs, until the time before the next tick runs out."""
        schedule, work = self.schedule, self.work
        while not self.stalled and work.may_start(schedule.time_free(), grid=schedule.running, tick=schedule.ticks):
            now = schedule.now()
            call = plan_call(self.table, now)
            call.prefill = work.prompt_work(
                self.table.prompts_left(), schedule.time_free(), grid=schedule.running, tick=schedule.ticks
            )
            if not (call.resets or call.starts or call.prefill):
                call.job = work.job_work(schedule.time_free(), grid=schedule.running, tick=schedule.ticks)
            if call.empty:
                break
            result = await self._run_call(call)
            seconds = schedule.now() - now
            if call.job is not None:
                job, frames = call.job
                work.job_done(job, frames, seconds, schedule.ticks, None if result is None else result.job)
            else:
                self.metrics.prompt_call.observe(seconds)
                if result is not None:
                    work.prompts_done(sum(result.prefilled.values()), seconds)
                self._update_gauges()
            if not schedule.running and schedule.wants_tick():
                break  # a conversation is due its first step: a grid starts for it at once

    async def _run_call(self, call: EngineCall) -> CallResult | None:
        """One engine call, watched; its result applied (None when it failed or stalled)."""
        table, now = self.table, self.schedule.now
        self._enter(ActorState.CALLING)
        started_at = now()
        try:
            outcome = await self._call_engine(call, started_at)
            if self.state is ActorState.STALLED:
                self._enter(ActorState.RECOVERING)
                await self._recover_from_stall(now() - started_at, call)
                return None
            if isinstance(outcome, Exception):
                logger.error(
                    "engine call failed; ending the conversations in it and resetting the engine", exc_info=outcome
                )
                self._enter(ActorState.RESETTING)
                self.metrics.errors.labels("engine").inc()
                fail_call(table, call, "internal error in the model engine; please reconnect")
                await self._reset_engine(call)
                return None
            apply_result(table, call, outcome, now(), self.metrics)
            return outcome
        finally:
            if ACTOR_LIFECYCLE.allows(self.state, ActorState.IDLE):  # (cancelled while stalled: it stays so)
                self._enter(ActorState.IDLE)
            if call.tick is not None:
                self.metrics.tick_engine.observe(now() - started_at)

    async def _call_engine(self, call: EngineCall, started_at: float) -> CallResult | Exception:
        """The engine call, watched: past ``engine_timeout`` its conversations end, and it is waited for."""
        async with trio.open_nursery() as watchdog:
            watchdog.start_soon(self._stall_at, started_at + self.settings.engine_timeout, call)
            try:
                result: CallResult = await self._in_worker_thread(execute, self.engine, call)
                return result
            except Exception as exc:  # the caller decides; nothing of it may escape the actor
                return exc
            finally:
                watchdog.cancel_scope.cancel()

    async def _stall_at(self, when: float, call: EngineCall) -> None:
        await self.schedule.sleep_until(when)
        self._enter(ActorState.STALLED)
        self.metrics.errors.labels("engine_stalled").inc()
        self.metrics.engine_stalled.set(1)
        logger.error(
            "engine call has not returned for %g s: ending its conversations and refusing new ones until it does",
            self.settings.engine_timeout,
        )
        fail_call(self.table, call, "the model engine stalled; please reconnect")
        self._changed()

    async def _recover_from_stall(self, seconds: float, call: EngineCall) -> None:
        logger.warning("the stalled engine call returned after %.1f s; resetting the engine", seconds)
        await self._reset_engine(call)
        self.metrics.engine_stalled.set(0)

    async def _reset_engine(self, call: EngineCall) -> None:
        """After a failed call: every row is reset, so every conversation on the engine loses its state (a
        prompt in progress runs again, a live conversation ends) and the call's job fails."""
        try:
            await self._in_worker_thread(self.engine.reset_all)
        except Exception:
            logger.exception("engine reset failed")
            self.metrics.errors.labels("engine_reset").inc()
        lost = LeaseFailure(CloseCode.INTERNAL_ERROR, "internal error in the model engine; please reconnect")
        for _, lease in self.table.leases(frozenset({LeaseState.LIVE, LeaseState.FLUSHING, LeaseState.PAUSED})):
            lease.fail(lost)
        for _, lease in self.table.leases(frozenset({LeaseState.PREFILL})):
            lease.prompt_lost()
        if call.job is not None:
            self.work.fail_job(call.job[0], RuntimeError("the model engine failed while running this; try again"))
        self._changed()

    # -- helpers -------------------------------------------------------------

    async def _in_worker_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        # Only shutdown cancels the actor; then a call still running is left to finish on its own.
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter, abandon_on_cancel=True)

    def _enter(self, state: ActorState) -> None:
        self.state = ACTOR_LIFECYCLE.move(self.state, state)

    def _changed(self) -> None:
        self._wakeup.set()
        self._update_gauges()

    def _update_gauges(self) -> None:
        snapshot = self.schedule.snapshot()
        self.metrics.tick_margin.set(snapshot.margin)
        self.metrics.client_reaction.set(snapshot.reaction)
        self._set_slot_gauges(self.table.slot_states(self.schedule.now()))

    def _set_slot_gauges(self, slots: dict[str, int]) -> None:
        frame = self.engine.frame_size
        self.metrics.conversations_behind.set(sum(lease.input_behind >= frame for lease in self.table.live()))
        for state, count in slots.items():
            self.metrics.slots.labels(state).set(count)
        self.metrics.queued.set(self.table.queued)
