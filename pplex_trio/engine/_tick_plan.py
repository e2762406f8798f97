"""One engine call's work, in three parts: plan (Trio thread), execute (worker thread), apply (Trio thread).

An engine call is either a **tick** (every LIVE conversation's next frame,
one batched step) or a **prompt call** between ticks (system prompts run in
chunks, sized by the schedule to the time left before the next tick; with
no prompt waiting, frames of a voice being made from a recording instead).
Either may first reset the rows freed since the last call and start the
conversations given a slot since.

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
from ._interface import ConversationRejected, Engine, SlotMode, StepOutput, VoiceJob
from ._lease import Lease, OutputFrame
from ._slots import SlotPhase, SlotTable

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TickPlan:
    """What one tick asks of the engine: a mode and a frame per row."""

    tick: int
    modes: list[SlotMode]
    pcm: np.ndarray
    arrivals: list[float | None]  # when each LIVE row's input frame was complete
    slacks: list[float]  # the tick's deadline minus input arrival, per row that got a frame
    missed: list[Lease]  # streaming rows that got no frame this tick (late pages, or stopped: see LatePages)


@dataclasses.dataclass
class EngineCall:
    """One engine call, fixed before it runs."""

    leases: list[Lease | None]  # each row's lease when planned
    started_at: float  # Trio time at which the call began
    resets: list[int] = dataclasses.field(default_factory=list)
    starts: list[tuple[int, Conversation]] = dataclasses.field(default_factory=list)
    prefill: dict[int, int] = dataclasses.field(default_factory=dict)  # prompt positions per slot
    voice: tuple[VoiceJob, int] | None = None  # a voice being made, and its frames to make in this call
    tick: TickPlan | None = None

    @property
    def involved(self) -> set[int]:
        """The rows whose conversations this call touches (those a failure of it ends)."""
        rows = {i for i, _ in self.starts} | set(self.prefill)
        if self.tick is not None:
            rows |= {i for i, mode in enumerate(self.tick.modes) if mode is not SlotMode.IDLE}
        return rows


@dataclasses.dataclass
class CallResult:
    started: dict[int, int]  # slot -> prompt positions it needs
    rejected: dict[int, tuple[CloseCode, str]]
    prefilled: dict[int, int]  # slot -> prompt positions run
    output: StepOutput | None
    step_seconds: float  # time inside engine.step (the compute the latency metric excludes)
    voice: bytes | Exception | None = None  # the voice, when this call finished it (or why it failed)


def plan_call(table: SlotTable, now: float) -> EngineCall:
    """A call with the rows to reset and the conversations to start (free drained slots, restart the prompts
    asked for again, admit the waiting)."""
    resets = table.free_drained() + table.restart_prompts()
    table.admit_waiting(now)
    starts = [(slot.index, slot.lease.conversation) for slot in table.slots
              if slot.phase is SlotPhase.PREFILL and slot.lease is not None and not slot.started]
    return EngineCall(leases=[slot.lease for slot in table.slots], started_at=now, resets=resets, starts=starts)


def plan_tick(table: SlotTable, call: EngineCall, tick: int, pcm: np.ndarray, now: float, deadline: float,
              tick_seconds: float, metrics: Metrics) -> None:
    """Make ``call`` a tick: cut every LIVE conversation's next input frame into ``pcm`` (silence where none).

    Slacks are measured from the tick's ``deadline``, not from ``now``: the
    steering moves the grid of deadlines, and a tick may start before its
    deadline (early start) or after it (held, or behind).
    """
    n = len(table.slots)
    modes = [SlotMode.IDLE] * n
    arrivals: list[float | None] = [None] * n
    slacks: list[float] = []
    missed: list[Lease] = []
    for slot in table.slots:
        i = slot.index
        pcm[i] = 0.0
        if slot.phase is not SlotPhase.LIVE or slot.lease is None:
            continue
        try:
            arrival, skipped = table.take_input(slot, pcm[i], tick)
        except Exception:  # one conversation's trouble is that conversation's, never the actor's
            _fail_row(table, i, metrics, "cutting its input frame")
            pcm[i] = 0.0
            continue
        modes[i] = SlotMode.LIVE
        arrivals[i] = arrival
        if skipped:
            metrics.samples_skipped.inc(skipped)
        if arrival is not None:
            slacks.append(deadline - arrival)
            continue
        if table.still_streaming(slot, now, tick_seconds):
            missed.append(slot.lease)  # still streaming, but this tick came before its frame
    live = modes.count(SlotMode.LIVE)
    metrics.frames_in.inc(len(slacks))  # (one update per tick, not per row)
    metrics.frames_silence.inc(live - len(slacks))
    call.tick = TickPlan(tick, modes, pcm, arrivals, slacks, missed)


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
    voice: bytes | Exception | None = None
    if call.voice is not None:
        job, frames = call.voice
        try:  # a voice that fails is that upload's trouble, not the conversations'
            job.advance(frames)
            voice = job.result() if job.frames_left == 0 else None
        except Exception as exc:
            voice = exc
    output = None
    began = time.perf_counter()
    if call.tick is not None and SlotMode.LIVE in call.tick.modes:
        output = engine.step(call.tick.modes, call.tick.pcm)
    return CallResult(started, rejected, prefilled, output, time.perf_counter() - began, voice)


def apply_result(table: SlotTable, call: EngineCall, result: CallResult, now: float, metrics: Metrics) -> None:
    """Hand each row's outcome to the lease it was planned for, if it still holds the slot."""
    slots = table.slots

    def still_held(i: int) -> bool:
        return call.leases[i] is not None and slots[i].lease is call.leases[i]

    for i, (code, message) in result.rejected.items():
        if still_held(i):
            metrics.errors.labels("start_rejected" if code == CloseCode.POLICY else "engine_start").inc()
            table.fail_slot(slots[i], code, message)
    for i, positions in result.started.items():
        if still_held(i):
            table.started(slots[i], positions)
    for i, positions in result.prefilled.items():
        metrics.prompt_positions.inc(positions)
        if still_held(i):
            table.prefilled(slots[i], positions)
    tick = call.tick
    if tick is None or result.output is None:
        return
    delivered = 0
    for i, mode in enumerate(tick.modes):
        if mode is not SlotMode.LIVE or not still_held(i):
            continue  # released (or failed) while the engine ran: its output is dropped
        try:
            table.deliver(slots[i], OutputFrame(
                result.output.pcm[i].copy(), result.output.text[i], tick.tick, input_arrival=tick.arrivals[i],
                step_seconds=result.step_seconds, tick_started=call.started_at, delivered=now,
            ))
            delivered += 1
        except Exception:  # one conversation's trouble is that conversation's, never the actor's
            _fail_row(table, i, metrics, "delivering its output")
    metrics.frames_out.inc(delivered)


def fail_call(table: SlotTable, call: EngineCall, message: str) -> None:
    """The engine call failed or stalled: end every conversation it involved (1011, ``message``)."""
    for i in sorted(call.involved):
        slot = table.slots[i]
        if slot.lease is call.leases[i] and slot.lease is not None:
            table.fail_slot(slot, CloseCode.INTERNAL_ERROR, message)


def _fail_row(table: SlotTable, i: int, metrics: Metrics, doing: str) -> None:
    logger.exception("slot %d: internal error %s; ending that conversation", i, doing)
    metrics.errors.labels("session").inc()
    table.fail_slot(table.slots[i], CloseCode.INTERNAL_ERROR,
                    "internal server error in this conversation; please reconnect")
