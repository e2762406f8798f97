"""EngineActor: the one task that owns the engine and drives the lockstep.

Every 80 ms (Trio clock) it runs **one** batched step over all slots on a
worker thread, with a capacity limiter of one: the engine is not thread-safe
and a GPU step must never run twice at once.  Sessions never call the engine;
they hold a :class:`Lease` and exchange frames with the actor through it.

Scheduling: ticks are due every ``tick_seconds``.  A tick that overruns makes
the next one start at once; when the actor is a whole tick or more behind, it
skips the missed ticks (counting them) instead of bursting to catch up.  The
grid itself drifts by a few milliseconds at most per tick towards the moment
the conversations' audio arrives (see ``_phase``).

**Input grace.**  A phase-aligned conversation's page lands a safety margin
before the tick that takes it.  When jitter makes it a little late, the
frame would miss its tick: the model hears a silent frame, and the stream
carries a frame of extra delay until the framer catches up.  So a tick whose
aligned conversation is short of exactly its next page waits for that page,
up to ``input_grace`` (4 ms), a few times per second at most: jitter costs
the others a few milliseconds now and then instead of costing one
conversation 80 ms, and the margin can stay small.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import trio

from .._channel import DropOldestChannel
from .._metrics import Metrics
from ._framing import InputFramer
from ._interface import Conversation, ConversationRejected, Engine, SlotMode, StepOutput
from ._phase import PhaseSteering
from ._slots import Lease, OutputFrame, SlotPhase, SlotTable

logger = logging.getLogger(__name__)

TICK_SECONDS = 0.080
INPUT_GRACE = 0.004
GRACE_WINDOW = 25  # ticks (2 s) ...
GRACE_PER_WINDOW = 3  # ... in which at most this many may be held
INTERNAL_ERROR = 1011
POLICY = 1008

RunSync = Callable[..., Awaitable[Any]]


@dataclasses.dataclass
class _Plan:
    """What one tick asks of the engine, fixed before the engine call."""

    tick: int
    resets: list[int]
    starts: list[tuple[int, Conversation]]
    modes: list[SlotMode]
    leases: list[Lease | None]
    pcm: np.ndarray
    arrivals: list[float | None]  # when each LIVE row's input frame was complete
    started: float  # Trio time at which the tick began


@dataclasses.dataclass
class _Result:
    started: dict[int, int]
    rejected: dict[int, tuple[int, str]]
    output: StepOutput | None
    step_seconds: float  # time inside engine.step (the compute the latency metric excludes)


@dataclasses.dataclass(frozen=True)
class ActorStatistics:
    slots_total: int
    slots_free: int
    queued: int
    phases: dict[str, int]
    ticks: int
    ticks_skipped: int


def _carry_text(dropped: OutputFrame, successor: OutputFrame) -> None:
    """A dropped frame's audio is gone, but its text piece goes out with the next frame."""
    if dropped.text:
        successor.text = dropped.text + (successor.text or "")


class EngineActor:
    """Owns ``engine``; sessions get slots through :meth:`lease`.

    ``run_sync`` runs the engine calls; by default a worker thread limited to
    one at a time.  Tests may pass an inline runner to keep a deterministic
    clock.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        metrics: Metrics | None = None,
        queue_size: int = 16,
        tick_seconds: float = TICK_SECONDS,
        input_backlog_frames: int = 6,
        output_backlog_frames: int = 8,
        input_grace: float = INPUT_GRACE,
        run_sync: RunSync | None = None,
    ):
        self.engine = engine
        self.metrics = metrics or Metrics()
        self.table = SlotTable(engine.num_slots, queue_size=queue_size)
        self.tick_seconds = tick_seconds
        self.input_backlog_frames = input_backlog_frames
        self.output_backlog_frames = output_backlog_frames
        self._limiter = trio.CapacityLimiter(1)
        self._run_sync = run_sync or self._in_worker_thread
        self._wakeup = trio.Event()
        self._pcm = np.zeros((engine.num_slots, engine.frame_size), dtype=np.float32)
        self.ticks = 0
        self.ticks_skipped = 0
        self.engine_busy = False  # an engine call is in flight
        self.phase = PhaseSteering()
        self.input_grace = input_grace
        self._held: collections.deque[int] = collections.deque()  # recent ticks held for a page
        self._awaited: list[Lease] = []  # leases whose due page the current hold waits for
        self._page_arrived = trio.Event()
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
        lease = Lease(
            conversation,
            framer=InputFramer(self.engine.frame_size, self.input_backlog_frames, align=align),
            outbox=DropOldestChannel(
                self.output_backlog_frames, name="output_backlog", on_drop=self.metrics.drop,
                salvage=_carry_text,
            ),
        )
        self.table.request(lease)
        self._changed()
        try:
            yield lease
        finally:
            self.table.release(lease)
            lease.outbox.close()
            self._changed()

    def push_input(self, lease: Lease, pcm: np.ndarray, arrived_at: float) -> None:
        """Queue input PCM that reached the server at ``arrived_at`` (oldest frames drop on overflow)."""
        self.metrics.drop("input_backlog", lease.framer.push(pcm, arrived_at))
        if lease in self._awaited and lease.framer.pending_frames:
            self._awaited.remove(lease)
            if not self._awaited:
                self._page_arrived.set()

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
            self.metrics.tick_lateness.observe(max(0.0, now - deadline))
            await self._hold_for_due_pages(now, deadline)
            started = trio.current_time()
            await self._tick()
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
            await trio.sleep_until(deadline)

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

    async def _hold_for_due_pages(self, now: float, deadline: float) -> None:
        """Wait for aligned conversations' due pages, until ``input_grace`` past the deadline at most."""
        while self._held and self._held[0] <= self.ticks - GRACE_WINDOW:
            self._held.popleft()
        until = deadline + self.input_grace
        if now >= until or len(self._held) >= GRACE_PER_WINDOW:
            return
        awaited = [
            slot.lease for slot in self.table.slots
            if slot.phase is SlotPhase.LIVE and slot.lease is not None
            and slot.lease.framer.awaits_page and now - slot.lease.framer.last_arrival < self.tick_seconds
        ]
        if not awaited:
            return
        self._held.append(self.ticks)
        self._awaited = awaited
        self._page_arrived = trio.Event()
        with trio.move_on_at(until):
            await self._page_arrived.wait()
        self._awaited = []
        self.metrics.tick_input_wait.observe(trio.current_time() - now)

    async def _tick(self) -> None:
        freed = self.table.free_drained()
        self.table.admit_waiting()
        plan = self._plan(freed)
        self.engine_busy = True
        started_at = trio.current_time()
        try:
            result = await self._run_sync(self._execute, plan)
        except Exception:
            logger.exception("engine step failed; ending the conversations in it and resetting the engine")
            self.metrics.errors.labels("engine").inc()
            self._fail_plan(plan)
            try:
                await self._run_sync(self.engine.reset_all)
            except Exception:
                logger.exception("engine reset failed")
                self.metrics.errors.labels("engine_reset").inc()
        else:
            self._apply(plan, result)
        finally:
            self.engine_busy = False
            self.metrics.tick_engine.observe(trio.current_time() - started_at)
            self.ticks += 1
            self._update_gauges()

    def _plan(self, resets: list[int]) -> _Plan:
        n = len(self.table.slots)
        modes = [SlotMode.IDLE] * n
        leases: list[Lease | None] = [None] * n
        arrivals: list[float | None] = [None] * n
        starts = []
        pcm = self._pcm
        now = trio.current_time()
        slacks: list[float] = []
        late = 0
        for slot in self.table.slots:
            i = slot.index
            lease = leases[i] = slot.lease
            if slot.phase is SlotPhase.PREFILL and lease is not None:
                if slot.started:
                    modes[i] = SlotMode.PREFILL
                else:
                    starts.append((i, lease.conversation))  # its mode is known once started
            elif slot.phase is SlotPhase.LIVE and lease is not None:
                modes[i] = SlotMode.LIVE
                skipped = lease.framer.skipped_samples
                arrivals[i] = lease.framer.pop_frame_into(pcm[i])
                if lease.framer.skipped_samples != skipped:
                    self.metrics.samples_skipped.inc(lease.framer.skipped_samples - skipped)
                if arrivals[i] is not None:
                    lease.frames_consumed += 1
                    lease.last_consumed_tick = self.ticks
                    self.metrics.frames_in.inc()
                    slacks.append(now - arrivals[i])
                    continue
                self.metrics.frames_silence.inc()
                if lease.frames_consumed and now - lease.framer.last_arrival < 2 * self.tick_seconds:
                    late += 1  # still streaming, but this tick came before its frame
            pcm[i] = 0.0
        self._phase_step = self.phase.adjust(slacks, late)
        return _Plan(self.ticks, resets, starts, modes, leases, pcm, arrivals, now)

    def _execute(self, plan: _Plan) -> _Result:
        """The engine calls of one tick, on the worker thread."""
        engine = self.engine
        for slot in plan.resets:
            engine.reset(slot)
        started: dict[int, int] = {}
        rejected: dict[int, tuple[int, str]] = {}
        for slot, conversation in plan.starts:
            try:
                steps = engine.start(slot, conversation)
            except ConversationRejected as exc:
                rejected[slot] = (POLICY, str(exc))
            except Exception:
                logger.exception("engine.start failed for slot %d", slot)
                rejected[slot] = (INTERNAL_ERROR, "the engine could not start this conversation; try again")
            else:
                started[slot] = steps
                plan.modes[slot] = SlotMode.PREFILL if steps > 0 else SlotMode.IDLE
        output = None
        began = time.perf_counter()
        if any(mode is not SlotMode.IDLE for mode in plan.modes):
            output = engine.step(plan.modes, plan.pcm)
        return _Result(started, rejected, output, time.perf_counter() - began)

    def _apply(self, plan: _Plan, result: _Result) -> None:
        slots = self.table.slots
        now = trio.current_time()
        for i, (code, message) in result.rejected.items():
            if slots[i].lease is plan.leases[i]:
                self.metrics.errors.labels("start_rejected" if code == POLICY else "engine_start").inc()
                self.table.fail_slot(slots[i], code, message)
        for i, steps in result.started.items():
            slot, lease = slots[i], plan.leases[i]
            if slot.lease is lease and lease is not None:
                slot.started = True
                slot.prefill_left = steps
                lease.prefill_total = steps
                if steps == 0:
                    self.table.go_live(slot)
        for i, mode in enumerate(plan.modes):
            slot, lease = slots[i], plan.leases[i]
            if lease is None or slot.lease is not lease:
                continue  # released (or failed) while the engine ran: its output is dropped
            if mode is SlotMode.PREFILL:
                slot.prefill_left -= 1
                if slot.prefill_left <= 0:
                    self.table.go_live(slot)
            elif mode is SlotMode.LIVE:
                assert result.output is not None
                frame = OutputFrame(
                    result.output.pcm[i].copy(), result.output.text[i], plan.tick,
                    input_arrival=plan.arrivals[i], step_seconds=result.step_seconds,
                    tick_started=plan.started, delivered=now,
                )
                lease.outbox.send_nowait(frame)
                lease.frames_delivered += 1
                lease.last_delivered_tick = plan.tick
                self.metrics.frames_out.inc()
                lease.notify()

    def _fail_plan(self, plan: _Plan) -> None:
        involved = {i for i, mode in enumerate(plan.modes) if mode is not SlotMode.IDLE}
        involved.update(i for i, _ in plan.starts)
        for i in sorted(involved):
            slot = self.table.slots[i]
            if slot.lease is plan.leases[i] and slot.lease is not None:
                self.table.fail_slot(slot, INTERNAL_ERROR, "internal error in the model engine; please reconnect")

    # -- helpers -------------------------------------------------------------

    async def _in_worker_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _changed(self) -> None:
        self._wakeup.set()
        self._update_gauges()

    def _update_gauges(self) -> None:
        self.metrics.tick_margin.set(self.phase.margin)
        for phase in SlotPhase:
            self.metrics.slots.labels(phase.value).set(self.table.count(phase))
        self.metrics.queued.set(self.table.queued)
