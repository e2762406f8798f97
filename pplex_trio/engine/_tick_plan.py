"""One tick's work, in three parts: plan (Trio thread), execute (worker thread), apply (Trio thread).

The plan fixes, before the engine call, which rows reset, start, prefill or
run live, and cuts each live conversation's input frame into the batch.  The
engine call then runs on a worker thread while sessions keep arriving and
leaving; so applying the result checks that each row still belongs to the
lease it was planned for, and drops the output of rows released meanwhile
(their slots are DRAINING and only freed before the next plan: drain before
release).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from .._conversation import CloseCode, Conversation
from .._metrics import Metrics
from ._interface import ConversationRejected, Engine, SlotMode, StepOutput
from ._slots import Lease, OutputFrame, SlotPhase, SlotTable

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TickPlan:
    """What one tick asks of the engine, fixed before the engine call."""

    tick: int
    resets: list[int]
    starts: list[tuple[int, Conversation]]
    modes: list[SlotMode]
    leases: list[Lease | None]
    pcm: np.ndarray
    arrivals: list[float | None]  # when each LIVE row's input frame was complete
    started: float  # Trio time at which the tick began
    slacks: list[float]  # the tick's deadline minus input arrival, per row that got a frame
    missed: list[Lease]  # streaming rows that got no frame this tick (late pages, or stopped: see _late_pages)


@dataclasses.dataclass
class TickResult:
    started: dict[int, int]
    rejected: dict[int, tuple[CloseCode, str]]
    output: StepOutput | None
    step_seconds: float  # time inside engine.step (the compute the latency metric excludes)


def plan_tick(table: SlotTable, tick: int, resets: list[int], pcm: np.ndarray, now: float, deadline: float,
              tick_seconds: float, metrics: Metrics) -> TickPlan:
    """Cut every LIVE conversation's next input frame into ``pcm`` (silence where none is ready).

    Slacks are measured from the tick's ``deadline``, not from ``now``: the
    steering moves the grid of deadlines, and a tick may start before its
    deadline (early start) or after it (held, or behind).
    """
    n = len(table.slots)
    modes = [SlotMode.IDLE] * n
    leases: list[Lease | None] = [None] * n
    arrivals: list[float | None] = [None] * n
    starts = []
    slacks: list[float] = []
    missed: list[Lease] = []
    for slot in table.slots:
        i = slot.index
        lease = leases[i] = slot.lease
        if slot.phase is SlotPhase.PREFILL and lease is not None:
            if slot.started:
                modes[i] = SlotMode.PREFILL
            else:
                starts.append((i, lease.conversation))  # its mode is known once started
        elif slot.phase is SlotPhase.LIVE and lease is not None:
            try:
                arrivals[i], skipped = table.take_input(slot, pcm[i], tick)
            except Exception:  # one conversation's trouble is that conversation's, never the actor's
                _fail_row(table, i, metrics, "cutting its input frame")
                pcm[i] = 0.0
                continue
            modes[i] = SlotMode.LIVE
            if skipped:
                metrics.samples_skipped.inc(skipped)
            if arrivals[i] is not None:
                metrics.frames_in.inc()
                slacks.append(deadline - arrivals[i])
                continue
            metrics.frames_silence.inc()
            if table.still_streaming(slot, now, tick_seconds):
                missed.append(lease)  # still streaming, but this tick came before its frame
        pcm[i] = 0.0
    return TickPlan(tick, resets, starts, modes, leases, pcm, arrivals, now, slacks, missed)


def execute(engine: Engine, plan: TickPlan) -> TickResult:
    """The engine calls of one tick, on the worker thread."""
    for slot in plan.resets:
        engine.reset(slot)
    started: dict[int, int] = {}
    rejected: dict[int, tuple[CloseCode, str]] = {}
    for slot, conversation in plan.starts:
        try:
            steps = engine.start(slot, conversation)
        except ConversationRejected as exc:
            rejected[slot] = (CloseCode.POLICY, str(exc))
        except Exception:
            logger.exception("engine.start failed for slot %d", slot)
            rejected[slot] = (CloseCode.INTERNAL_ERROR, "the engine could not start this conversation; try again")
        else:
            started[slot] = steps
            plan.modes[slot] = SlotMode.PREFILL if steps > 0 else SlotMode.IDLE
    output = None
    began = time.perf_counter()
    if any(mode is not SlotMode.IDLE for mode in plan.modes):
        output = engine.step(plan.modes, plan.pcm)
    return TickResult(started, rejected, output, time.perf_counter() - began)


def apply_result(table: SlotTable, plan: TickPlan, result: TickResult, now: float, metrics: Metrics) -> None:
    """Hand each row's outcome to the lease it was planned for, if it still holds the slot."""
    slots = table.slots

    def still_held(i: int) -> bool:
        return plan.leases[i] is not None and slots[i].lease is plan.leases[i]

    for i, (code, message) in result.rejected.items():
        if still_held(i):
            metrics.errors.labels("start_rejected" if code == CloseCode.POLICY else "engine_start").inc()
            table.fail_slot(slots[i], code, message)
    for i, steps in result.started.items():
        if still_held(i):
            table.started(slots[i], steps)
    for i, mode in enumerate(plan.modes):
        if not still_held(i):
            continue  # released (or failed) while the engine ran: its output is dropped
        try:
            if mode is SlotMode.PREFILL:
                table.prefill_stepped(slots[i])
            elif mode is SlotMode.LIVE:
                assert result.output is not None
                table.deliver(slots[i], OutputFrame(
                    result.output.pcm[i].copy(), result.output.text[i], plan.tick,
                    input_arrival=plan.arrivals[i], step_seconds=result.step_seconds,
                    tick_started=plan.started, delivered=now,
                ))
                metrics.frames_out.inc()
        except Exception:  # one conversation's trouble is that conversation's, never the actor's
            _fail_row(table, i, metrics, "delivering its output")


def fail_plan(table: SlotTable, plan: TickPlan, message: str) -> None:
    """The engine call failed or stalled: end every conversation it involved (1011, ``message``)."""
    involved = {i for i, mode in enumerate(plan.modes) if mode is not SlotMode.IDLE}
    involved.update(i for i, _ in plan.starts)
    for i in sorted(involved):
        slot = table.slots[i]
        if slot.lease is plan.leases[i] and slot.lease is not None:
            table.fail_slot(slot, CloseCode.INTERNAL_ERROR, message)


def _fail_row(table: SlotTable, i: int, metrics: Metrics, doing: str) -> None:
    logger.exception("slot %d: internal error %s; ending that conversation", i, doing)
    metrics.errors.labels("session").inc()
    table.fail_slot(table.slots[i], CloseCode.INTERNAL_ERROR,
                    "internal server error in this conversation; please reconnect")
