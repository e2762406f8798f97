"""One engine call's work, in three parts: plan (Trio thread), execute (worker thread), apply (Trio thread).

An engine call is either a **tick** (every live conversation's next frame,
one batched step) or a call **between ticks** (system prompts run in chunks,
or frames of a job; ``_work.py`` sizes them).  Either first resets the rows
freed since the last call and starts the conversations given a slot since.

The plan fixes, before the engine call, which rows reset, start, prefill or
run live, and cuts each live conversation's input frame into the batch.  The
engine call then runs on a worker thread while sessions keep arriving,
leaving and restarting; so applying the result checks that each row still
holds the lease it was planned for, at the same run of its prompt, in the
state the result is for, and drops what no longer applies (a slot given back
meanwhile is DRAINING and only freed before the next plan: drain before
release).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Collection

import numpy as np

from .._conversation import CloseCode, Conversation
from .._metrics import Metrics
from ._engine_lease import EngineLease
from ._interface import ConversationRejected, Engine, Job, SlotMode, StepOutput
from ._lease_core import LIVE_STATES, LeaseFailure, LeaseState
from ._outbox import OutputFrame
from ._slots import SlotTable

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TickPlan:
    """What one tick asks of the engine: a mode and a frame per row."""

    tick: int
    modes: list[SlotMode]
    pcm: np.ndarray
    arrivals: dict[int, tuple[EngineLease, float | None]]  # each live row's lease, and when its frame was complete


@dataclasses.dataclass
class EngineCall:
    """One engine call, fixed before it runs."""

    rows: list[tuple[EngineLease, int] | None]  # each row's lease when planned, and the run of its prompt
    started_at: float  # Trio time at which the call began
    resets: list[int] = dataclasses.field(default_factory=list)
    starts: list[tuple[int, Conversation]] = dataclasses.field(default_factory=list)
    prefill: dict[int, int] = dataclasses.field(default_factory=dict)  # prompt positions per slot
    job: tuple[Job, int] | None = None  # a job between ticks, and its frames to run in this call
    tick: TickPlan | None = None

    @property
    def empty(self) -> bool:
        """Nothing to do: no reset, start, prompt, job or tick (the actor does not call the engine)."""
        return not (self.resets or self.starts or self.prefill or self.job or self.tick)

    @property
    def involved(self) -> set[int]:
        """The rows whose conversations this call touches (those a failure of it ends)."""
        rows = {i for i, _ in self.starts} | set(self.prefill)
        if self.tick is not None:
            rows |= {i for i, mode in enumerate(self.tick.modes) if mode is not SlotMode.IDLE}
        return rows

    def lease(self, table: SlotTable, i: int, state: frozenset[LeaseState]) -> EngineLease | None:
        """Row ``i``'s lease, if it is still the one planned, at the same run of its prompt, in one of
        ``state``; else None (its outcome no longer applies)."""
        planned = self.rows[i]
        if planned is None:
            return None
        lease, restarts = planned
        if table.rows[i] is not lease or lease.restarts != restarts or lease.state not in state:
            return None
        return lease


@dataclasses.dataclass
class CallResult:
    """What one engine call came back with, applied on the Trio thread (see :func:`apply_result`)."""

    started: dict[int, int]  # slot -> prompt positions it needs
    rejected: dict[int, tuple[CloseCode, str]]
    prefilled: dict[int, int]  # slot -> prompt positions run
    output: StepOutput | None
    step_seconds: float  # time inside engine.step (the compute the latency metric excludes)
    job: bytes | Exception | None = None  # what the job made, when this call ran its last frame (or why it failed)


_STARTING = frozenset({LeaseState.STARTING})
_PREFILL = frozenset({LeaseState.PREFILL})


def plan_call(table: SlotTable, now: float) -> EngineCall:
    """A call with the rows to reset and the conversations to start (free the drained slots, admit the
    waiting, start every STARTING lease: new ones, and those whose prompt is to run again)."""
    resets = table.free_drained(now)
    table.admit_waiting(now)
    starts = [(i, lease.conversation) for i, lease in table.leases(_STARTING)]
    rows = [None if lease is None else (lease, lease.restarts) for lease in table.rows]
    return EngineCall(rows=rows, started_at=now, resets=resets, starts=starts)


def plan_tick(
    table: SlotTable,
    call: EngineCall,
    tick: int,
    pcm: np.ndarray,
    first_steps: Collection[EngineLease],
    metrics: Metrics,
) -> None:
    """Make ``call`` a tick: cut every live conversation's next input frame into ``pcm`` (silence where none);
    the READY conversations of ``first_steps`` are stepped from this tick on."""
    modes = [SlotMode.IDLE] * len(table.rows)
    arrivals: dict[int, tuple[EngineLease, float | None]] = {}
    pcm[:] = 0.0
    for lease in first_steps:
        if lease.state is LeaseState.READY:
            lease.first_step()
    for i, lease in table.leases(LIVE_STATES):
        try:
            arrival, skipped = lease.take_frame(pcm[i], tick, call.started_at)
        except Exception:  # one conversation's trouble is that conversation's, never the actor's
            _fail_row(table, i, metrics, "cutting its input frame")
            pcm[i] = 0.0
            continue
        modes[i] = SlotMode.LIVE
        arrivals[i] = (lease, arrival)
        if skipped:
            metrics.samples_skipped.inc(skipped)
    heard = sum(arrival is not None for _, arrival in arrivals.values())
    metrics.frames_in.inc(heard)  # (one update per tick, not per row)
    metrics.frames_silence.inc(len(arrivals) - heard)
    call.tick = TickPlan(tick, modes, pcm, arrivals)


def execute(engine: Engine, call: EngineCall) -> CallResult:
    """The engine calls of one call, on the worker thread."""
    for slot in call.resets:
        engine.reset(slot)
    started: dict[int, int] = {}
    rejected: dict[int, tuple[CloseCode, str]] = {}
    for slot, conversation in call.starts:
        try:
            started[slot] = engine.start(slot, conversation)
        except ConversationRejected as exc:
            rejected[slot] = (CloseCode.POLICY, str(exc))
        except Exception:
            logger.exception("engine.start failed for slot %d", slot)
            rejected[slot] = (CloseCode.INTERNAL_ERROR, "the engine could not start this conversation; try again")
    prefilled = engine.prefill(call.prefill) if call.prefill else {}
    made: bytes | Exception | None = None
    if call.job is not None:
        job, frames = call.job
        try:  # a job that fails is its caller's trouble, not the conversations'
            job.advance(frames)
            made = job.result() if job.frames_left == 0 else None
        except Exception as exc:
            made = exc
    output = None
    began = time.perf_counter()
    if call.tick is not None and SlotMode.LIVE in call.tick.modes:
        output = engine.step(call.tick.modes, call.tick.pcm)
    return CallResult(started, rejected, prefilled, output, time.perf_counter() - began, made)


def apply_result(table: SlotTable, call: EngineCall, result: CallResult, now: float, metrics: Metrics) -> None:
    """Hand each row's outcome to the lease it was planned for, if it still applies."""
    for i, (code, message) in result.rejected.items():
        if (lease := call.lease(table, i, _STARTING)) is not None:
            metrics.errors.labels("start_rejected" if code == CloseCode.POLICY else "engine_start").inc()
            lease.fail(LeaseFailure(code, message))
    for i, positions in result.started.items():
        if (lease := call.lease(table, i, _STARTING)) is not None and lease.started(positions, now):
            metrics.time_to_live.observe(now - lease.prompt_since)
    for i, positions in result.prefilled.items():
        metrics.prompt_positions.inc(positions)
        if (lease := call.lease(table, i, _PREFILL)) is not None and lease.prefilled(positions, now):
            metrics.time_to_live.observe(now - lease.prompt_since)
    tick = call.tick
    if tick is None or (output := result.output) is None:
        return
    if output.transcriber_failed:
        metrics.transcriber_failures.inc()
    delivered = 0
    for i, mode in enumerate(tick.modes):
        if mode is not SlotMode.LIVE or (lease := call.lease(table, i, LIVE_STATES)) is None:
            continue  # given back (or failed, or restarted) while the engine ran: its output is dropped
        try:
            lease.deliver(
                OutputFrame(
                    output.pcm[i].copy(),
                    output.text[i],
                    tick.tick,
                    heard=tick.pcm[i].copy(),
                    input_arrival=tick.arrivals[i][1],
                    step_seconds=result.step_seconds,
                    heard_text=None if output.heard_text is None else output.heard_text[i],
                    end_of_turn=None if output.end_of_turn is None else output.end_of_turn[i],
                    tick_started=call.started_at,
                    delivered=now,
                )
            )
            delivered += 1
        except Exception:  # one conversation's trouble is that conversation's, never the actor's
            _fail_row(table, i, metrics, "delivering its output")
    metrics.frames_out.inc(delivered)


def fail_call(table: SlotTable, call: EngineCall, message: str) -> None:
    """The engine call failed or stalled: end every conversation it involved (1011, ``message``)."""
    failure = LeaseFailure(CloseCode.INTERNAL_ERROR, message)
    for i in sorted(call.involved):
        planned = call.rows[i]
        if planned is not None and table.rows[i] is planned[0]:
            planned[0].fail(failure)


def _fail_row(table: SlotTable, i: int, metrics: Metrics, doing: str) -> None:
    logger.exception("slot %d: internal error %s; ending that conversation", i, doing)
    metrics.errors.labels("session").inc()
    table.fail(
        i, LeaseFailure(CloseCode.INTERNAL_ERROR, "internal server error in this conversation; please reconnect")
    )
