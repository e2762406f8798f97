"""The work between ticks: one queue, sized by one cost model.

Between two ticks the actor runs what conversations and the server asked of
the engine, in this order: the resets of freed rows and the starts of
conversations given a slot (a fixed cost per call), the **system prompts**
of the conversations joining (every row in PREFILL, batched into one engine
call, shared evenly), then **jobs** (a voice being made from a recording, or
any other :class:`~pplex_trio.engine._interface.Job`), one at a time, first
come first served, only when no prompt waits.  Each call is sized to the
time the :class:`~pplex_trio.engine._schedule.TickSchedule` leaves before the
next tick may start, from what the calls of its kind cost so far
(:class:`WorkCost`: fixed + per unit, padded), so a live conversation's tick
is never late because of it.  With nobody live there is no tick to protect:
a call takes up to a tick's worth.

Work that finds no room for ``starved_ticks`` ticks (a cost estimate
spoiled by one slow call, an engine slower than real time) gets a small call
anyway, so nothing waits for ever: prompts even at a tick's cost (a
conversation is waiting to join), jobs only while the tick is not due yet.
That count is the ``work_starved`` setting's seconds, in ticks (the schedule's).
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Mapping

import trio

from ._interface import Job

PROMPT_FIRST_POSITIONS = 4  # per row, while nothing is known of the cost and a tick is due


class WorkCost:
    """What a call costs: ``fixed + per_unit * units``, fitted to the recent calls.

    A least-squares slope over the recent calls, and the typical (median)
    rest as the fixed part.  Until it has seen calls of two sizes it takes
    the one it saw as all per-unit (which overestimates small calls: safe).
    Its estimate is padded by ``SAFETY`` so that one mis-estimate does not
    make a tick late; a median, not a maximum, so that one slow call (a
    collection, a busy event loop) does not starve the work for the next
    dozens.
    """

    SAFETY = 1.25

    def __init__(self, keep: int = 24):
        self._seen: collections.deque[tuple[int, float]] = collections.deque(maxlen=keep)
        self.fixed = 0.0
        self.per_unit = 0.0
        self.calls = 0
        self.units = 0

    @property
    def known(self) -> bool:
        """Whether a call that ran units has been seen (calls of starts and resets alone tell the fixed cost,
        not the cost per unit)."""
        return self.per_unit > 0 or any(n for n, _ in self._seen)

    def observe(self, units: int, seconds: float) -> None:
        """A call ran ``units`` in ``seconds``: refit the fixed cost and the cost per unit on the recent calls."""
        self.calls += 1
        self.units += units
        self._seen.append((units, seconds))
        sizes = [n for n, _ in self._seen]
        if len(set(sizes)) < 2:
            slope = statistics.median(s for _, s in self._seen) / sizes[0] if sizes[0] else self.per_unit
        else:
            mean_n, mean_s = statistics.fmean(sizes), statistics.fmean(s for _, s in self._seen)
            var = statistics.fmean((n - mean_n) ** 2 for n in sizes)
            slope = max(0.0, statistics.fmean((n - mean_n) * (s - mean_s) for n, s in self._seen) / var)
        self.per_unit = slope
        self.fixed = max(0.0, statistics.median(s - slope * n for n, s in self._seen))

    def units_within(self, seconds: float) -> int:
        """How many units a call may take to last at most ``seconds`` (estimated, padded)."""
        if not self.known:
            return 1 << 30 if seconds > 0 else 0
        room = seconds / self.SAFETY - self.fixed
        if room <= 0:
            return 0
        return int(room / self.per_unit) if self.per_unit > 0 else 1 << 30


def share(left: Mapping[int, int], total: int) -> dict[int, int]:
    """``total`` units shared evenly among the slots of ``left``, none above what it has left."""
    work = {slot: 0 for slot, n in left.items() if n > 0}
    while total > 0 and work:
        open_ = [slot for slot in work if work[slot] < left[slot]]
        if not open_:
            break
        each = max(1, total // len(open_))
        for slot in open_:
            more = min(each, left[slot] - work[slot], total)
            work[slot] += more
            total -= more
    return {slot: n for slot, n in work.items() if n > 0}


class PendingJob:
    """A job asked of the actor, and what came of it."""

    def __init__(self, job: Job, tick: int):
        self.job = job
        self.progress_tick = tick  # the tick of its last progress (at first: when it was asked)
        self.done = trio.Event()
        self.outcome: bytes | Exception | None = None

    def finish(self, outcome: bytes | Exception) -> None:
        """It is done: keep what it made (or why it failed) and wake its caller."""
        self.outcome = outcome
        self.done.set()


class BetweenTicks:
    """The queue of work between ticks, and what each kind of it costs (see the module docstring)."""

    def __init__(self, *, starved_ticks: int) -> None:
        self.starved_ticks = starved_ticks  # work that found no room for this many ticks gets a small call anyway
        self.prompt_cost = WorkCost()  # per position, the call's starts and resets included
        self._job_costs: dict[type, WorkCost] = {}  # per frame, one model per kind of job
        self.jobs: collections.deque[PendingJob] = collections.deque()
        self._prompts_starved_since: int | None = None  # the tick since which waiting prompts found no room

    # -- jobs ------------------------------------------------------------------

    def submit(self, job: Job, tick: int) -> PendingJob:
        """Queue ``job``, asked at ``tick``, behind the others; its caller waits on the returned ``done``."""
        pending = PendingJob(job, tick)
        self.jobs.append(pending)
        return pending

    def withdraw(self, pending: PendingJob) -> None:
        """Its caller has gone (a call already running finishes its frames)."""
        if pending in self.jobs:
            self.jobs.remove(pending)

    def job_cost(self, job: Job) -> WorkCost:
        """The cost model of ``job``'s kind (per frame), made at its first use."""
        return self._job_costs.setdefault(type(job), WorkCost())

    # -- when a call may start, and what it does --------------------------------

    def may_start(self, time_free: float, *, grid: bool, tick: int) -> bool:
        """Whether an engine call between ticks may start now, ``time_free`` before the next tick may (on a
        ``grid``: a conversation is live): there is time for one (its fixed cost: the trip to the worker
        thread, starts, resets), or work has starved."""
        if not grid:
            return True  # nobody live: no tick to protect (a slow call once must not stop the work)
        if time_free > self.prompt_cost.fixed * WorkCost.SAFETY or self._prompts_starved(tick):
            return True
        return bool(self.jobs) and time_free > 0 and self._job_starved(tick)

    def prompt_work(self, left: Mapping[int, int], time_free: float, *, grid: bool, tick: int) -> dict[int, int]:
        """Positions for each prompting slot (``left``: what each still has) that fit ``time_free``.

        Shared evenly.  Without a grid a call takes up to a tick of work, at
        least one position per row, so the actor stays responsive and always
        progresses; while the cost is not known yet, a small first call
        measures it.  When not even one position fits, nothing, unless the
        prompts have found no room for ``starved_ticks`` ticks: then a
        small call anyway, so a joining conversation is never stuck.
        """
        total = self.prompt_cost.units_within(time_free)
        waiting = sum(1 for n in left.values() if n > 0)
        if not grid:
            total = max(total, waiting)
        if not self.prompt_cost.known or (grid and self._prompts_starved(tick)):
            total = min(max(total, waiting), PROMPT_FIRST_POSITIONS * waiting)
        work = share(left, total)
        if waiting and not work:
            if self._prompts_starved_since is None:
                self._prompts_starved_since = tick
        else:
            self._prompts_starved_since = None
        return work

    def job_work(self, time_free: float, *, grid: bool, tick: int) -> tuple[Job, int] | None:
        """The first job waiting and its frames that fit ``time_free`` (None: no job, or no room).

        With no room, nothing (its caller waits), unless the job has made no
        progress for ``starved_ticks`` ticks: then one frame, if the tick
        is not due yet, which also measures the cost again (one slow call
        must not stop the jobs for good).  Without a grid, up to a tick of
        work, at least a frame; while the cost is not known, a small first
        call measures it.
        """
        if not self.jobs:
            return None
        job = self.jobs[0].job
        cost = self.job_cost(job)
        frames = cost.units_within(time_free)
        if not grid:
            frames = max(frames, 1)
        elif not frames and time_free > 0 and self._job_starved(tick):
            frames = 1
        if not cost.known:
            frames = min(frames, PROMPT_FIRST_POSITIONS)
        frames = min(job.frames_left, frames)
        return (job, frames) if frames else None

    def prompts_done(self, positions: int, seconds: float) -> None:
        """A call ran ``positions`` of prompts in ``seconds`` (its starts, its resets and the trip to the worker
        thread and back included)."""
        self.prompt_cost.observe(positions, seconds)

    def job_done(self, job: Job, frames: int, seconds: float, tick: int, outcome: bytes | Exception | None) -> None:
        """A call made ``frames`` frames of ``job`` in ``seconds``; ``outcome``: its product when that was its
        last frame, or why it failed (None: more to do)."""
        self.job_cost(job).observe(frames, seconds)
        pending = next((p for p in self.jobs if p.job is job), None)
        if pending is None:
            return  # its caller has gone
        pending.progress_tick = tick
        if outcome is not None:
            self.jobs.remove(pending)
            pending.finish(outcome)

    def fail_job(self, job: Job, error: Exception) -> None:
        """The engine failed while running ``job``: its caller gets ``error``."""
        pending = next((p for p in self.jobs if p.job is job), None)
        if pending is not None:
            self.jobs.remove(pending)
            pending.finish(error)

    # -- inside --------------------------------------------------------------

    def _prompts_starved(self, tick: int) -> bool:
        since = self._prompts_starved_since
        return since is not None and tick - since >= self.starved_ticks

    def _job_starved(self, tick: int) -> bool:
        return bool(self.jobs) and tick - self.jobs[0].progress_tick >= self.starved_ticks
