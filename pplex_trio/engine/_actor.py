"""EngineActor: the one task that owns the engine and drives the lockstep.

While a conversation is live it runs **one** batched step over all slots
every 80 ms (Trio clock), and between those ticks it runs the joining
conversations' system prompts, in chunks sized to the time left before the
next tick (then, in the time they leave, voices being made from
recordings); with nobody live it runs them back to back.  Every engine
call goes to a worker thread, with a capacity limiter of one: the engine is
not thread-safe and a GPU call must never run twice at once.  Sessions
never call the engine; they hold a :class:`~pplex_trio.engine.Lease` and
exchange frames through it.

When a tick starts, what waits for it and how much time is free for
prompts is the :class:`~pplex_trio.engine._schedule.TickSchedule`'s to say
(the grid, its steering, the input grace, the early start, the handshake's
lead, the prompts' cost).  What one engine call does is in ``_tick_plan``.

**Faults.**  An engine call that raises ends the conversations it involved
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
from ._framing import InputFramer
from ._interface import Engine, VoiceJob
from ._schedule import TickSchedule
from ._settings import ActorSettings
from ._lease import LIVE_STATES, Lease, LeaseState
from ._slots import SlotPhase, SlotTable
from ._tick_plan import CallResult, EngineCall, apply_result, execute, fail_call, plan_call, plan_tick

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
        self.schedule = TickSchedule(self.table, settings.tick_seconds, input_grace=settings.input_grace_ms / 1000,
                                     early_start=settings.early_start_ms / 1000)
        self._limiter = trio.CapacityLimiter(1)
        self._run_sync = run_sync or self._in_worker_thread
        self._wakeup = trio.Event()
        self._pcm = np.zeros((engine.num_slots, engine.frame_size), dtype=np.float32)
        self._starting: dict[Lease, float] = {}  # conversations started, not yet live: since when
        self._voices: list[_PendingVoice] = []  # voices to make, first come first made
        self.engine_busy = False  # an engine call is in flight
        self.stalled = False  # that call has run past engine_timeout (and not returned yet)
        self._update_gauges()

    # -- sessions ------------------------------------------------------------

    @contextlib.contextmanager
    def lease(self, conversation: Conversation, *, align: bool = False, early_audio: bool = False,
              client: str | None = None) -> Iterator[Lease]:
        """Claim a slot (or a place in the queue) for the duration of the block.

        ``align`` asks for phase-aligned framing of this conversation's input
        (lower latency; may skip a few ms of audio once to catch up, see
        :class:`InputFramer`); ``early_audio`` keeps what the client says
        before the conversation is live for the model (see
        :meth:`Lease.push_input`); ``client`` (an address) names who asks, for
        the slot held for a client that left (see :class:`SlotTable`).  Raises
        :class:`QueueFull` at once if there is neither a slot nor a place in the
        queue.  On exit the slot drains: it is freed only between engine calls.
        """
        s = self.settings
        lease = Lease(
            conversation,
            framer=InputFramer(self.engine.frame_size, s.input_backlog_frames, align=align),
            output_capacity=s.output_backlog_frames,
            on_drop=self.metrics.drop,
            on_input=self.schedule.input_arrived,
            on_end=self._release,
            early_audio=early_audio,
            client=client,
        )
        self.table.request(lease, _now())
        self._changed()
        try:
            yield lease
        finally:
            lease.end()

    def _release(self, lease: Lease, client_left: bool) -> None:
        self.table.release(lease, _now(), hold=client_left)
        self._starting.pop(lease, None)
        self._changed()

    @property
    def ticks(self) -> int:
        return self.schedule.ticks

    @property
    def ticks_skipped(self) -> int:
        return self.schedule.ticks_skipped

    def statistics(self) -> ActorStatistics:
        table = self.table
        return ActorStatistics(
            slots_total=len(table.slots),
            slots_free=table.free_count(_now()),
            queued=table.queued,
            phases={phase.value: table.count(phase) for phase in SlotPhase},
            ticks=self.ticks,
            ticks_skipped=self.ticks_skipped,
        )

    # -- voices made from recordings ----------------------------------------------

    async def make_voice(self, pcm: np.ndarray) -> bytes:
        """Make a voice from ``pcm`` (mono float32 at the engine's rate, at -24 LUFS; see
        :meth:`Engine.make_voice`) between ticks, after the joining conversations' prompts: a live
        conversation's tick never waits for it.  One voice at a time, in the order asked.

        Error handling: ``NotImplementedError`` from an engine without voices,
        the job's own exception when making it fails; cancelling the caller
        drops the job (a call already running finishes its frames).
        """
        job = _PendingVoice(self.engine.make_voice(pcm))
        self._voices.append(job)
        self._changed()
        try:
            await job.done.wait()
        finally:
            if job in self._voices:
                self._voices.remove(job)
        if isinstance(job.outcome, Exception):
            raise job.outcome
        assert job.outcome is not None
        return job.outcome

    @property
    def voices_waiting(self) -> int:
        """Voices asked for and not made yet (the one being made included)."""
        return len(self._voices)

    def _plan_voice(self, call: EngineCall) -> None:
        """With nothing else to do between ticks, frames of the first voice waiting (if they fit)."""
        if self._voices and not (call.resets or call.starts or call.prefill):
            job = self._voices[0].job
            frames = self.schedule.voice_work(job.frames_left)
            if frames:
                call.voice = (job, frames)

    def _voice_done(self, call: EngineCall, result: CallResult | None, seconds: float) -> None:
        assert call.voice is not None
        job, frames = call.voice
        self.schedule.voice_done(frames, seconds)
        pending = next((p for p in self._voices if p.job is job), None)
        if pending is None:
            return  # its caller has gone
        if result is None:
            pending.finish(RuntimeError("the model engine failed while making this voice; try again"))
        elif result.voice is not None:
            if isinstance(result.voice, Exception) and not isinstance(result.voice, ValueError):
                logger.error("making a voice failed", exc_info=result.voice)
            pending.finish(result.voice)

    # -- the loop ------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick while a conversation is live, run prompts between ticks; idle while no slot is in use."""
        task_status.started()
        schedule = self.schedule
        while True:
            if self.table.count(SlotPhase.LIVE):
                self._start_grid()
                await self._tick()
            elif schedule.running:
                schedule.stop()
            await self._between_ticks()
            if not self.table.busy() and not self._voices:
                self._wakeup = trio.Event()
                await self._wakeup.wait()  # nothing to run until a conversation comes
            await trio.lowlevel.checkpoint()

    async def _tick(self) -> None:
        schedule, metrics = self.schedule, self.metrics
        start = await schedule.wait_for_tick()
        metrics.tick_lateness.observe(start.late)
        if start.early:
            metrics.tick_early.observe(start.early)
        if start.held is not None:
            metrics.tick_input_wait.observe(start.held)
        began = trio.current_time()
        assert schedule.deadline is not None
        call = plan_call(self.table, began)
        plan_tick(self.table, call, schedule.ticks, self._pcm, began, schedule.deadline, self.tick_seconds, metrics)
        assert call.tick is not None
        await self._run_call(call)
        metrics.tick_duration.observe(trio.current_time() - began)
        skipped = schedule.tick_done(call.tick.slacks, call.tick.missed, began)
        if skipped:
            metrics.ticks_skipped.inc(skipped)
            logger.warning("engine actor fell %d tick(s) behind; skipping ahead", skipped)
        self._update_gauges()

    async def _between_ticks(self) -> None:
        """Resets, starts and system prompts, until the time before the next tick runs out."""
        while not self.stalled and self.schedule.may_run_prompts(voice_waiting=bool(self._voices)):
            now = trio.current_time()
            call = plan_call(self.table, now)
            call.prefill = self.schedule.prompt_work(self.table.prompts_left())
            self._plan_voice(call)
            if not (call.resets or call.starts or call.prefill or call.voice):
                break
            for i, _ in call.starts:
                lease = call.leases[i]
                if lease is not None:
                    self._starting.setdefault(lease, now)
            result = await self._run_call(call)
            seconds = trio.current_time() - now
            if call.voice is not None:
                self._voice_done(call, result, seconds)
                continue
            self.metrics.prompt_call.observe(seconds)
            if result is not None:
                self.schedule.prompt_done(sum(result.prefilled.values()), seconds)
            self._went_live()
            self._update_gauges()
            if not self.schedule.running and self.table.count(SlotPhase.LIVE):
                self._start_grid()  # before anything else runs: its session's handshake waits for this grid
                break

    def _start_grid(self) -> None:
        """A fresh grid for the first live conversation, its first tick a period away: the handshake goes out
        just before it, and the client's first frame makes that tick."""
        if not self.schedule.running:
            self.schedule.start(trio.current_time() + self.tick_seconds)

    def _went_live(self) -> None:
        now = trio.current_time()
        for lease in [lease for lease in self._starting if lease.state is not LeaseState.PREFILL]:
            if lease.state in LIVE_STATES:
                self.metrics.time_to_live.observe(now - self._starting[lease])
            del self._starting[lease]

    async def _run_call(self, call: EngineCall) -> CallResult | None:
        """One engine call, watched; its result applied (None when it failed or stalled)."""
        table = self.table
        self.engine_busy = True
        started_at = trio.current_time()
        try:
            outcome = await self._call_engine(call)
            if self.stalled:
                await self._recover_from_stall(trio.current_time() - started_at)
                return None
            if isinstance(outcome, Exception):
                logger.error("engine call failed; ending the conversations in it and resetting the engine",
                             exc_info=outcome)
                self.metrics.errors.labels("engine").inc()
                fail_call(table, call, "internal error in the model engine; please reconnect")
                await self._reset_engine()
                return None
            apply_result(table, call, outcome, trio.current_time(), self.metrics)
            return outcome
        finally:
            self.engine_busy = False
            if call.tick is not None:
                self.metrics.tick_engine.observe(trio.current_time() - started_at)

    async def _call_engine(self, call: EngineCall) -> CallResult | Exception:
        """The engine call, watched: past ``engine_timeout`` its conversations end, and it is waited for."""
        async with trio.open_nursery() as watchdog:
            watchdog.start_soon(self._stall_after, self.settings.engine_timeout, call)
            try:
                result: CallResult = await self._run_sync(execute, self.engine, call)  # (run_sync is untyped)
                return result
            except Exception as exc:  # the caller decides; nothing of it may escape the actor
                return exc
            finally:
                watchdog.cancel_scope.cancel()

    async def _stall_after(self, seconds: float, call: EngineCall) -> None:
        await trio.sleep(seconds)
        self.stalled = True
        self.metrics.errors.labels("engine_stalled").inc()
        self.metrics.engine_stalled.set(1)
        logger.error("engine call has not returned for %g s: ending its conversations and refusing new ones "
                     "until it does", seconds)
        fail_call(self.table, call, "the model engine stalled; please reconnect")
        self._changed()

    async def _recover_from_stall(self, seconds: float) -> None:
        logger.warning("the stalled engine call returned after %.1f s; resetting the engine", seconds)
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
        state = self.schedule.state()
        self.metrics.tick_margin.set(state.margin)
        self.metrics.client_reaction.set(state.reaction)
        for phase in SlotPhase:
            self.metrics.slots.labels(phase.value).set(self.table.count(phase))
        self.metrics.queued.set(self.table.queued)


class _PendingVoice:
    """A voice asked of the actor, and what came of it."""

    def __init__(self, job: VoiceJob):
        self.job = job
        self.done = trio.Event()
        self.outcome: bytes | Exception | None = None

    def finish(self, outcome: bytes | Exception) -> None:
        self.outcome = outcome
        self.done.set()


def _now() -> float:
    """Trio's clock; outside a Trio run (a test's direct look), a time after every slot's hold has lapsed."""
    try:
        return trio.current_time()
    except RuntimeError:
        return math.inf
