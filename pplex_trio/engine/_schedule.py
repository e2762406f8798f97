"""When the next tick starts, what waits for it, and how much time is free for system prompts.

One :class:`TickSchedule` per engine actor owns every timing decision:

* **the grid**: ticks are due every ``tick_seconds`` while a conversation is
  live; a tick that overruns makes the next one start at once, and one a
  whole tick behind skips ahead (counted) instead of bursting;
* **steering** (:class:`PhaseSteering`): the grid drifts a few milliseconds
  per tick towards the moment the conversations' audio arrives, keeping a
  safety margin that a late page widens;
* **late pages** (:class:`LatePages`): a tick's misses count as jitter only
  once the page turns up after all (a client that stopped is no late page);
* **input grace**: a tick may wait a few milliseconds past its deadline for
  an aligned conversation's page that is due, a few times per 2 s at most;
* **early start**: within ``early_start`` of its deadline a tick starts as
  soon as every streaming live conversation has its frame (the deadlines do
  not move, so ticks come no more often);
* **the handshake's lead**: a Moshi handshake goes out ``margin`` plus the
  clients' measured reaction before a tick, so a client that streams from
  the handshake lands its pages just ahead of the ticks;
* **prompt time**: system prompts run between ticks, never at their cost:
  a prompt call is sized (:class:`PromptCost`, from the calls measured so
  far) to end ``PROMPT_MARGIN`` before the next tick may start; voices being
  made from recordings take the time the prompts leave, sized the same way.

:meth:`TickSchedule.state` is the one record of all this that ``/metrics``
and the tests read.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping

import trio

from ._lease import Lease
from ._slots import SlotPhase, SlotTable
from ._steering import LatePages, PhaseSteering

GRACE_WINDOW = 25  # ticks (2 s) ...
GRACE_PER_WINDOW = 3  # ... in which at most this many may be held
DEFAULT_REACTION = 0.003
MAX_REACTION = 0.020  # beyond this the "reaction" is a client that did not start at the handshake
PROMPT_MARGIN = 0.004  # a prompt call ends this long before the next tick may start
PROMPT_FIRST_POSITIONS = 4  # per row, while nothing is known of the cost and a tick is due
PROMPT_STARVED_TICKS = 25  # prompts that found no time for this many ticks get a small call anyway


@dataclasses.dataclass(frozen=True)
class ScheduleState:
    """What the schedule knows, at one moment (``/metrics``, tests)."""

    running: bool  # a grid of ticks is on: a conversation is live
    deadline: float | None  # when the next tick is due
    ticks: int
    ticks_skipped: int
    ticks_held: int  # held past their deadline for a due page (input grace)
    margin: float  # the steering's safety margin
    moved: float  # how far the steering has moved the grid, in all (negative: earlier)
    reaction: float  # the clients' handshake reaction (median of the recent ones)
    prompt_fixed: float  # a prompt call's estimated fixed cost (s) ...
    prompt_per_position: float  # ... and its cost per position (s)
    prompt_calls: int
    prompt_positions: int


@dataclasses.dataclass
class TickStart:
    """How a tick started: seconds past its deadline, before it (early start), held for a due page."""

    late: float
    early: float
    held: float | None = None


class TickSchedule:
    """The actor's clock: ``wait_for_tick`` / ``tick_done`` around each tick, ``prompt_work`` between them."""

    def __init__(self, table: SlotTable, tick_seconds: float, *, input_grace: float, early_start: float,
                 clock: Callable[[], float] = trio.current_time):
        self.table = table
        self.tick_seconds = tick_seconds
        self.input_grace = input_grace
        self.early_start = early_start
        self._clock = clock
        self.steering = PhaseSteering()
        self.late_pages = LatePages(tick_seconds)
        self.prompt_cost = PromptCost()
        self.voice_cost = PromptCost()  # frames of voices made from recordings (:meth:`voice_work`)
        self.deadline: float | None = None
        self.ticks = 0
        self.ticks_skipped = 0
        self._held: collections.deque[int] = collections.deque()  # recent ticks that were held
        self._ticks_held = 0
        self._step = 0.0  # the steering's move for the next deadline
        self._reactions: collections.deque[float] = collections.deque(maxlen=15)
        self.reaction = DEFAULT_REACTION
        self._awaited: set[Lease] | None = None  # leases a wait is for (None: nobody waits)
        self._some_frame = False
        self._frames_in = trio.Event()
        self._starved_since: int | None = None  # the tick since which waiting prompts found no time
        self._voice_starved_since: int | None = None  # ... and a waiting voice

    # -- the grid ------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.deadline is not None

    def start(self, first_deadline: float) -> None:
        """A fresh grid (the first live conversation): slacks measured on any earlier one mean nothing."""
        self.deadline = first_deadline
        self.steering.forget()
        self.late_pages.forget()
        self._step = 0.0

    def stop(self) -> None:
        """No conversation is live: no more ticks until :meth:`start`."""
        self.deadline = None

    async def wait_for_tick(self) -> TickStart:
        """Until the tick may start: an early start, its deadline, then maybe a grace for a due page."""
        assert self.deadline is not None
        deadline = self.deadline
        if self.early_start > 0:
            await trio.sleep_until(deadline - self.early_start)
            awaited, some_frame = self._missing_frames()
            await self._wait_frames(awaited, deadline, some_frame=some_frame)
        else:
            await trio.sleep_until(deadline)
        now = self._clock()
        start = TickStart(late=max(0.0, now - deadline), early=max(0.0, deadline - now))
        if self._grace_allowed(now, deadline):
            awaited = {slot.lease for slot in self.table.slots if slot.lease is not None
                       and self.table.has_due_page(slot, now, self.tick_seconds)}
            if awaited:
                self._held.append(self.ticks)
                self._ticks_held += 1
                await self._wait_frames(awaited, deadline + self.input_grace)
                start.held = self._clock() - now
        return start

    def tick_done(self, slacks: list[float], missed: list[Lease], tick_started: float) -> int:
        """After a tick: steer, set the next deadline; returns the ticks skipped to catch up (0 mostly)."""
        assert self.deadline is not None
        self.ticks += 1
        step = self.steering.adjust(slacks, self.late_pages.confirm(missed, tick_started))
        self.deadline += self.tick_seconds + step
        behind = self._clock() - self.deadline
        skipped = 0
        if behind >= self.tick_seconds:
            skipped = int(behind // self.tick_seconds)
            self.deadline += skipped * self.tick_seconds
            self.ticks_skipped += skipped
        return skipped

    def _grace_allowed(self, now: float, deadline: float) -> bool:
        while self._held and self._held[0] <= self.ticks - GRACE_WINDOW:
            self._held.popleft()
        return self.input_grace > 0 and now < deadline + self.input_grace and len(self._held) < GRACE_PER_WINDOW

    def _missing_frames(self) -> tuple[set[Lease], bool]:
        """The streaming live leases still short of a frame, and whether any live lease has one."""
        table, now = self.table, self._clock()
        awaited: set[Lease] = set()
        some_frame = False
        for slot in table.slots:
            lease = slot.lease
            if slot.phase is not SlotPhase.LIVE or lease is None:
                continue
            if table.has_input_frame(lease):
                some_frame = True
            elif table.still_streaming(slot, now, self.tick_seconds):
                awaited.add(lease)
        return awaited, some_frame

    # -- frames arriving -------------------------------------------------------

    async def _wait_frames(self, awaited: set[Lease], until: float, *, some_frame: bool = True) -> None:
        """Until every lease in ``awaited`` has a frame (and, with ``some_frame=False``, some lease has one)."""
        self._awaited, self._some_frame = awaited, some_frame
        self._frames_in = trio.Event()
        try:
            if awaited or not some_frame:
                with trio.move_on_at(until):
                    await self._frames_in.wait()
        finally:
            self._awaited = None

    def input_arrived(self, lease: Lease) -> None:
        """A push (every lease calls this): it may complete a frame that a wait is for."""
        awaited = self._awaited
        if awaited is None or not self.table.has_input_frame(lease):
            return
        self._some_frame = True
        awaited.discard(lease)
        if not awaited:
            self._frames_in.set()

    # -- the handshake -----------------------------------------------------------

    async def sleep_until_handshake(self) -> None:
        """Sleep until the handshake's lead before one of the next ticks (at most a tick; at once without a grid).

        A client that starts streaming when it gets the handshake (the official one does) sends its pages
        at the phase of that moment, for good: sent ``margin`` + the clients' reaction before a tick, its
        pages land just ahead of the ticks that take them.
        """
        if self.deadline is None:
            return
        lead = self.steering.margin + self.reaction
        now = self._clock()
        target = self.deadline - lead
        target += math.ceil((now - target) / self.tick_seconds) * self.tick_seconds
        await trio.sleep_until(target)

    def observe_reaction(self, handshake_sent: float, first_page_arrived: float, page_seconds: float) -> None:
        """A client's first page after the handshake: it began recording when the handshake reached it."""
        reaction = first_page_arrived - handshake_sent - page_seconds
        self._reactions.append(min(max(reaction, 0.0), MAX_REACTION))
        self.reaction = statistics.median(self._reactions)

    # -- system prompts between ticks --------------------------------------------

    def prompt_time(self) -> float:
        """Seconds a prompt call may take now (up to a tick without a grid; 0 when there is no room)."""
        if self.deadline is None:
            return self.tick_seconds
        return max(0.0, self.deadline - self.early_start - PROMPT_MARGIN - self._clock())

    def may_run_prompts(self, voice_waiting: bool = False) -> bool:
        """Whether an engine call between ticks may start now: there is time for one (its fixed cost: the trip
        to the worker thread, starts, resets), or prompts (or the voice waiting) have starved."""
        if not voice_waiting:
            self._voice_starved_since = None
        if self.deadline is None:  # nobody live: no tick to protect (a slow call once must not stop prompts)
            return True
        if self.prompt_time() > self.prompt_cost.fixed * PromptCost.SAFETY or self._starved():
            return True
        return voice_waiting and self.prompt_time() > 0 and self._voice_starved()

    def prompt_work(self, left: Mapping[int, int]) -> dict[int, int]:
        """Positions for each prompting slot (``left``: what each still has) that fit :meth:`prompt_time`.

        Shared evenly.  Without a grid (nobody live) a call takes up to a
        tick of work, at least one position per row, so the actor stays
        responsive and always progresses; while the cost is not known yet, a
        small first call measures it.  When not even one
        position fits, nothing, unless the prompts have found no time for
        :data:`PROMPT_STARVED_TICKS` ticks (an engine slower than real time):
        then a small call anyway, so a joining conversation is never stuck.
        """
        total = self.prompt_cost.positions_within(self.prompt_time())
        waiting = sum(1 for n in left.values() if n > 0)
        if self.deadline is None:
            total = max(total, waiting)
        if not self.prompt_cost.known or (self.deadline is not None and self._starved()):
            total = min(max(total, waiting), PROMPT_FIRST_POSITIONS * waiting)
        work = share(left, total)
        if waiting and not work:
            self._starved_since = self.ticks if self._starved_since is None else self._starved_since
        else:
            self._starved_since = None
        return work

    def voice_work(self, left: int) -> int:
        """Frames of a voice being made (``left``: what it still has) that fit :meth:`prompt_time`.

        Voices come after the system prompts and never at a tick's cost: with
        no time, none (the upload waits), unless the voice has found no time
        for :data:`PROMPT_STARVED_TICKS` ticks: then one frame, if the tick is
        not due yet, which also measures the cost again (one slow call must
        not stop voices for good).  Without a grid, up to a tick of work, at
        least a frame; while the cost is not known, a small first call
        measures it.
        """
        cost = self.voice_cost
        frames = cost.positions_within(self.prompt_time())
        if self.deadline is None:
            frames = max(frames, 1)
        elif not frames and self.prompt_time() > 0 and self._voice_starved():
            frames = 1
        if not cost.known:
            frames = min(frames, PROMPT_FIRST_POSITIONS)
        return min(left, frames)

    def voice_done(self, frames: int, seconds: float) -> None:
        """A call made ``frames`` frames of a voice in ``seconds`` (the trip to the worker thread included)."""
        self.voice_cost.observe(frames, seconds)
        self._voice_starved_since = None

    def _voice_starved(self) -> bool:
        """Whether the voice waiting has found no time for :data:`PROMPT_STARVED_TICKS` ticks (its clock starts
        at the first question)."""
        if self._voice_starved_since is None:
            self._voice_starved_since = self.ticks
        return self.ticks - self._voice_starved_since >= PROMPT_STARVED_TICKS

    def _starved(self) -> bool:
        return self._starved_since is not None and self.ticks - self._starved_since >= PROMPT_STARVED_TICKS

    def prompt_done(self, positions: int, seconds: float) -> None:
        """A prompt call ran ``positions`` in ``seconds`` (its starts, its resets and the trip to the worker
        thread and back included)."""
        self.prompt_cost.observe(positions, seconds)

    def state(self) -> ScheduleState:
        return ScheduleState(
            running=self.running, deadline=self.deadline, ticks=self.ticks, ticks_skipped=self.ticks_skipped,
            ticks_held=self._ticks_held, margin=self.steering.margin, moved=self.steering.moved,
            reaction=self.reaction, prompt_fixed=self.prompt_cost.fixed,
            prompt_per_position=self.prompt_cost.per_position, prompt_calls=self.prompt_cost.calls,
            prompt_positions=self.prompt_cost.positions)


def share(left: Mapping[int, int], total: int) -> dict[int, int]:
    """``total`` positions shared evenly among the slots of ``left``, none above what it has left."""
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


class PromptCost:
    """What a prompt call costs: ``fixed + per_position * positions``, fitted to the recent calls.

    A least-squares slope over the recent calls, and the typical (median)
    rest as the fixed part.  Until it has seen calls of two sizes it takes
    the one it saw as all per-position (which overestimates small calls:
    safe).  Its estimate is padded by ``SAFETY`` so that one mis-estimate
    does not make a tick late; a median, not a maximum, so that one slow call
    (a collection, a busy event loop) does not starve the prompts for the
    next dozens.
    """

    SAFETY = 1.25

    def __init__(self, keep: int = 24):
        self._seen: collections.deque[tuple[int, float]] = collections.deque(maxlen=keep)
        self.fixed = 0.0
        self.per_position = 0.0
        self.calls = 0
        self.positions = 0

    @property
    def known(self) -> bool:
        """Whether a call that ran positions has been seen (calls of starts and resets alone tell the fixed
        cost, not the cost per position)."""
        return self.per_position > 0 or any(n for n, _ in self._seen)

    def observe(self, positions: int, seconds: float) -> None:
        self.calls += 1
        self.positions += positions
        self._seen.append((positions, seconds))
        sizes = [n for n, _ in self._seen]
        if len(set(sizes)) < 2:
            slope = statistics.median(s for _, s in self._seen) / sizes[0] if sizes[0] else self.per_position
        else:
            mean_n, mean_s = statistics.fmean(sizes), statistics.fmean(s for _, s in self._seen)
            var = statistics.fmean((n - mean_n) ** 2 for n in sizes)
            slope = max(0.0, statistics.fmean((n - mean_n) * (s - mean_s) for n, s in self._seen) / var)
        self.per_position = slope
        self.fixed = max(0.0, statistics.median(s - slope * n for n, s in self._seen))

    def positions_within(self, seconds: float) -> int:
        """How many positions a call may take to last at most ``seconds`` (estimated, padded)."""
        if not self.known:
            return 1 << 30 if seconds > 0 else 0
        room = seconds / self.SAFETY - self.fixed
        if room <= 0:
            return 0
        return int(room / self.per_position) if self.per_position > 0 else 1 << 30
