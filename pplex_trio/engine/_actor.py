"""EngineActor: the one task that owns the engine and drives the lockstep.

Every 80 ms (Trio clock) it runs **one** batched step over all slots on a
worker thread, with a capacity limiter of one: the engine is not thread-safe
and a GPU step must never run twice at once.  Sessions never call the engine;
they hold a :class:`~pplex_trio.engine.Lease` and exchange frames through it.

Scheduling: ticks are due every ``tick_seconds``.  A tick that overruns makes
the next one start at once; when the actor is a whole tick or more behind, it
skips the missed ticks (counting them) instead of bursting to catch up.  The
grid itself drifts by a few milliseconds at most per tick towards the moment
the conversations' audio arrives (``_phase``), and a tick may wait a few
milliseconds for a page that is due (``_grace``), or start up to
``early_start_ms`` before it is due once every frame is in (``_early_start``).
What one tick does is in ``_tick_plan``.

**Faults.**  An engine call that raises ends the conversations of its tick
(1011) and the engine is reset.  One that hangs past ``engine_timeout`` ends
them as well and marks the actor *stalled* (``/health`` says so and new
conversations are refused), but is still waited for: the engine is not
thread-safe, so no other call may start; when it returns, the engine is reset
and the actor goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import trio

from .._conversation import Conversation
from .._metrics import Metrics
from ._early_start import EarlyStart
from ._frame_watch import FrameWatch
from ._framing import InputFramer
from ._grace import InputGrace
from ._interface import Engine
from ._late_pages import LatePages
from ._phase import PhaseSteering
from ._settings import ActorSettings
from ._slots import Lease, SlotPhase, SlotTable
from ._tick_plan import TickPlan, TickResult, apply_result, execute, fail_plan, plan_tick

logger = logging.getLogger(__name__)

RunSync = Callable[..., Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class ActorStatistics:
    slots_total: int
    slots_free: int
    queued: int
    phases: dict[str, int]
    ticks: int
    ticks_skipped: int


class EngineActor:
    """Owns ``engine``; sessions get slots through :meth:`lease`.

    ``run_sync`` runs the engine calls; by default a worker thread limited to
    one at a time.  Tests may pass an inline runner to keep a deterministic
    clock.
    """

    def __init__(
        self,
        engine: Engine,
        settings: ActorSettings | None = None,
        *,
        metrics: Metrics | None = None,
        run_sync: RunSync | None = None,
    ):
        self.engine = engine
        self.settings = settings = settings or ActorSettings()
        self.metrics = metrics or Metrics()
        self.table = SlotTable(engine.num_slots, queue_size=settings.queue_size)
        self.tick_seconds = settings.tick_seconds
        self._limiter = trio.CapacityLimiter(1)
        self._run_sync = run_sync or self._in_worker_thread
        self._wakeup = trio.Event()
        self._pcm = np.zeros((engine.num_slots, engine.frame_size), dtype=np.float32)
        self.ticks = 0
        self.ticks_skipped = 0
        self.engine_busy = False  # an engine call is in flight
        self.stalled = False  # that call has run past engine_timeout (and not returned yet)
        self.phase = PhaseSteering()
        self._late_pages = LatePages(settings.tick_seconds)
        self._frames = FrameWatch(self.table.has_input_frame)
        self.grace = InputGrace(settings.input_grace_ms / 1000, self._frames)
        self.early = EarlyStart(settings.early_start_ms / 1000, self.table, settings.tick_seconds, self._frames)
        self._phase_step = 0.0
        self._deadline: float | None = None  # when the next tick is due (None while idle)
        self._update_gauges()

    # -- sessions ------------------------------------------------------------

    @contextlib.contextmanager
    def lease(self, conversation: Conversation, *, align: bool = False) -> Iterator[Lease]:
        """Claim a slot (or a place in the queue) for the duration of the block.

        ``align`` asks for phase-aligned framing of this conversation's input
        (lower latency; may skip a few ms of audio once to catch up, see
        :class:`InputFramer`).  Raises :class:`QueueFull` at once if there is
        neither a slot nor a place in the queue.  On exit the slot drains: it
        is freed only between engine calls.
        """
        s = self.settings
        lease = Lease(
            conversation,
            framer=InputFramer(self.engine.frame_size, s.input_backlog_frames, align=align),
            output_capacity=s.output_backlog_frames,
            on_drop=self.metrics.drop,
            on_input=self._frames.input_arrived,
            on_end=self._release,
        )
        self.table.request(lease)
        self._changed()
        try:
            yield lease
        finally:
            lease.end()

    def _release(self, lease: Lease) -> None:
        self.table.release(lease)
        self._changed()

    def statistics(self) -> ActorStatistics:
        table = self.table
        return ActorStatistics(
            slots_total=len(table.slots),
            slots_free=table.count(SlotPhase.FREE),
            queued=table.queued,
            phases={phase.value: table.count(phase) for phase in SlotPhase},
            ticks=self.ticks,
            ticks_skipped=self.ticks_skipped,
        )

    async def sleep_until_before_tick(self, lead: float) -> None:
        """Sleep until ``lead`` seconds before one of the next ticks (at most one tick period).

        A client that starts streaming when it gets the handshake (the
        official one does) sends its pages at the phase of that moment, for
        good.  Sending the handshake ``lead`` before a tick puts those pages
        just ahead of the ticks that take them, so its frames barely wait,
        whatever the phase of the conversations that came before.
        """
        deadline = self._deadline
        if deadline is None:
            return
        now = trio.current_time()
        target = deadline - lead
        target += math.ceil((now - target) / self.tick_seconds) * self.tick_seconds
        await trio.sleep_until(target)

    # -- the loop ------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick forever (until cancelled).  Idle while no slot is in use."""
        task_status.started()
        deadline: float | None = None
        while True:
            while not self.table.busy():
                self._deadline = None
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                deadline = None
            now = trio.current_time()
            if deadline is None:
                deadline = now  # a fresh schedule after idling
                self.phase.forget()
                self._late_pages.forget()
            self.metrics.tick_lateness.observe(max(0.0, now - deadline))
            await self._hold_for_due_pages(now, deadline)
            started = trio.current_time()
            await self._tick(deadline)
            self.metrics.tick_duration.observe(trio.current_time() - started)
            deadline += self.tick_seconds + self._phase_step
            behind = trio.current_time() - deadline
            if behind >= self.tick_seconds:
                skipped = int(behind // self.tick_seconds)
                deadline += skipped * self.tick_seconds
                self.ticks_skipped += skipped
                self.metrics.ticks_skipped.inc(skipped)
                logger.warning("engine actor fell %d tick(s) behind; skipping ahead", skipped)
            self._deadline = deadline
            if await self.early.sleep_until(deadline):
                self.metrics.tick_early.observe(deadline - trio.current_time())

    async def _hold_for_due_pages(self, now: float, deadline: float) -> None:
        if not self.grace.allowed(self.ticks, now, deadline):
            return
        awaited = [slot.lease for slot in self.table.slots
                   if slot.lease is not None and self.table.has_due_page(slot, now, self.tick_seconds)]
        if awaited:
            await self.grace.hold(self.ticks, awaited, deadline)
            self.metrics.tick_input_wait.observe(trio.current_time() - now)

    async def _tick(self, deadline: float) -> None:
        table = self.table
        freed = table.free_drained()
        table.admit_waiting()
        plan = plan_tick(table, self.ticks, freed, self._pcm, trio.current_time(), deadline, self.tick_seconds,
                         self.metrics)
        self._phase_step = self.phase.adjust(plan.slacks, self._late_pages.confirm(plan.missed, plan.started))
        self.engine_busy = True
        started_at = trio.current_time()
        try:
            outcome = await self._call_engine(plan)
            if self.stalled:
                await self._recover_from_stall(trio.current_time() - started_at)
            elif isinstance(outcome, Exception):
                logger.error("engine step failed; ending the conversations in it and resetting the engine",
                             exc_info=outcome)
                self.metrics.errors.labels("engine").inc()
                fail_plan(table, plan, "internal error in the model engine; please reconnect")
                await self._reset_engine()
            else:
                apply_result(table, plan, outcome, trio.current_time(), self.metrics)
        finally:
            self.engine_busy = False
            self.metrics.tick_engine.observe(trio.current_time() - started_at)
            self.ticks += 1
            self._update_gauges()

    async def _call_engine(self, plan: TickPlan) -> TickResult | Exception:
        """The tick's engine call, watched: past ``engine_timeout`` its conversations end, and it is waited for."""
        async with trio.open_nursery() as watchdog:
            watchdog.start_soon(self._stall_after, self.settings.engine_timeout, plan)
            try:
                return await self._run_sync(execute, self.engine, plan)
            except Exception as exc:  # the caller decides; nothing of it may escape the actor
                return exc
            finally:
                watchdog.cancel_scope.cancel()

    async def _stall_after(self, seconds: float, plan: TickPlan) -> None:
        await trio.sleep(seconds)
        self.stalled = True
        self.metrics.errors.labels("engine_stalled").inc()
        self.metrics.engine_stalled.set(1)
        logger.error("engine step has not returned for %g s: ending its conversations and refusing new ones "
                     "until it does", seconds)
        fail_plan(self.table, plan, "the model engine stalled; please reconnect")
        self._changed()

    async def _recover_from_stall(self, seconds: float) -> None:
        logger.warning("the stalled engine step returned after %.1f s; resetting the engine", seconds)
        await self._reset_engine()
        self.stalled = False
        self.metrics.engine_stalled.set(0)

    async def _reset_engine(self) -> None:
        try:
            await self._run_sync(self.engine.reset_all)
        except Exception:
            logger.exception("engine reset failed")
            self.metrics.errors.labels("engine_reset").inc()

    # -- helpers -------------------------------------------------------------

    async def _in_worker_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        # Only shutdown cancels the actor; then a call still running is left to finish on its own.
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter, abandon_on_cancel=True)

    def _changed(self) -> None:
        self._wakeup.set()
        self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.tick_margin.set(self.phase.margin)
        for phase in SlotPhase:
            self.metrics.slots.labels(phase.value).set(self.table.count(phase))
        self.metrics.queued.set(self.table.queued)
