"""When the next tick starts, what waits for it, and how much time is free between ticks.

One :class:`TickSchedule` per engine actor owns every timing decision, the
tick period, and the actor's clock (:meth:`TickSchedule.now`,
:meth:`TickSchedule.sleep_until`):

* **the grid**: ticks are due every ``period`` while a conversation is
  live; a tick that overruns makes the next one start at once, and one a
  whole tick behind skips ahead (counted) instead of bursting;
* **the first step**: a conversation whose prompt has run (READY) is stepped
  from the first tick after its caller's first frame is in, as the
  reference server does, so its first words go to a client that listens;
  one that sends nothing for ``first_frame_timeout`` is stepped anyway (a
  client that only listens).  With no grid running the first frame starts
  one, its first tick at once;
* **steering** (:class:`~pplex_trio.engine._steering.PhaseSteering`): the
  grid drifts a few milliseconds per tick towards the moment the
  conversations' audio arrives, keeping a safety margin that a late page
  widens;
* **streaming and late pages**: a conversation that sent audio within the
  last two periods is streaming, so a tick without its frame came too early;
  such a miss counts as jitter only once its page turns up after all, within
  a period (a client that stopped is no late page);
* **input grace**: a tick may wait a few milliseconds past its deadline for
  an aligned conversation's page that is due, a few times per
  ``input_grace_window`` (2 s) at most;
* **early start**: within ``early_start`` of its deadline a tick starts as
  soon as every streaming live conversation has its frame (the deadlines do
  not move, so ticks come no more often); not while a conversation's next
  frame catches up on silence, so that its catch-up reaches the frame that
  lands before the deadline (else that frame, and each after it, waits a tick);
* **the handshake's lead**: a Moshi handshake goes out ``margin`` plus the
  clients' measured reaction before a tick, so a client that streams from
  the handshake lands its pages just ahead of the ticks; the reaction is
  timed here, from the handshake to that client's first page;
* **time free between ticks**: what is left before the next tick may start,
  less ``WORK_MARGIN`` (the work between ticks is sized to it, ``_work.py``).

The actor asks it one question per tick (:meth:`wait_for_tick`) and tells it
what the tick took (:meth:`tick_done`); its queries change nothing.
:meth:`snapshot` is the record ``/metrics`` and the tests read.

**Windows.**  Every window the timing looks back over is a setting in
seconds (``ActorSettings``: the grace's, the steering's, the framer's, the
work's starving); :meth:`TickSchedule.in_ticks` is the one place one becomes a
count of ticks, so a different ``tick_seconds`` keeps their lengths.  What is
measured in periods (streaming: sent within two; a late page: within one)
is about the grid itself and scales with it on purpose.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence

import trio

from .._conversation import SAMPLE_RATE
from ._engine_lease import EngineLease
from ._settings import ActorSettings
from ._slots import SlotTable
from ._steering import PhaseSteering

GRACE_PER_WINDOW = 3  # ticks that may be held in one ``input_grace_window``
DEFAULT_REACTION = 0.003
MAX_REACTION = 0.020  # beyond this the "reaction" is a client that did not start at the handshake
WORK_MARGIN = 0.004  # work between ticks ends this long before the next tick may start


@dataclasses.dataclass(frozen=True)
class ScheduleSnapshot:
    """What the schedule knows, at one moment (``/metrics``, tests)."""

    running: bool  # a grid of ticks is on: a conversation is live
    deadline: float | None  # when the next tick is due
    ticks: int
    ticks_skipped: int
    ticks_held: int  # held past their deadline for a due page (input grace)
    margin: float  # the steering's safety margin
    moved: float  # how far the steering has moved the grid, in all (negative: earlier)
    reaction: float  # the clients' handshake reaction (median of the recent ones)


@dataclasses.dataclass
class TickStart:
    """How a tick started: seconds past its deadline, before it (early start), held for a due page; and the
    READY conversations it steps for the first time."""

    late: float
    early: float
    held: float | None = None
    first_steps: list[EngineLease] = dataclasses.field(default_factory=list)


class TickSchedule:
    """The actor's clock: ``wait_for_tick`` / ``tick_done`` around each tick, ``time_free`` between them."""

    def __init__(self, table: SlotTable, settings: ActorSettings, *, clock: Callable[[], float] = trio.current_time):
        self.table = table
        self.period = settings.tick_seconds  # the lockstep period: the one place it is kept
        self.input_grace = settings.input_grace_ms / 1000
        self.early_start = settings.early_start_ms / 1000
        self.first_frame_timeout = settings.first_frame_timeout
        self._clock = clock
        self.grace_window = self.in_ticks(settings.input_grace_window)
        self.steering = PhaseSteering(
            window=self.in_ticks(settings.steering_window), calm_ticks=self.in_ticks(settings.steering_calm)
        )
        self.deadline: float | None = None
        self.ticks = 0
        self.ticks_skipped = 0
        self._held: collections.deque[int] = collections.deque()  # recent ticks that were held
        self._ticks_held = 0
        self._missed: list[EngineLease] = []  # the previous tick's streaming conversations that got no frame ...
        self._missed_at = 0.0  # ... and when that tick began
        self._reactions: collections.deque[float] = collections.deque(maxlen=15)
        self.reaction = DEFAULT_REACTION
        self._handshakes: dict[EngineLease, float] = {}  # handshakes sent, their first page not in yet
        self._awaited: set[EngineLease] | None = None  # leases a wait is for (None: nobody waits)
        self._some_frame = False
        self._frames_in = trio.Event()

    # -- the clock -----------------------------------------------------------

    def now(self) -> float:
        """The actor's clock (Trio's, or a test's)."""
        return self._clock()

    async def sleep_until(self, when: float) -> None:
        """Sleep until ``when`` on the actor's clock."""
        await trio.sleep_until(when)

    def in_ticks(self, seconds: float) -> int:
        """A window of ``seconds`` in ticks of this period (at least one; none for 0)."""
        return max(1, round(seconds / self.period)) if seconds > 0 else 0

    # -- the grid ------------------------------------------------------------

    @property
    def running(self) -> bool:
        """A grid of ticks is on (a conversation is live)."""
        return self.deadline is not None

    def start_grid(self) -> None:
        """A fresh grid for the first conversation to step: its first tick at once (its caller's first frame is
        in), due the steering's margin from now, so that the frames that follow at the same phase land that
        margin before their ticks; slacks of an earlier grid mean nothing now.  Nothing, while a grid runs."""
        if self.deadline is not None:
            return
        self.deadline = self._clock() + self.steering.margin
        self.steering.forget()
        self._missed = []

    def wants_tick(self) -> bool:
        """A conversation is stepped, or one is due its first step."""
        return self.table.any_live() or bool(self._first_steps(self._clock()))

    def next_first_step(self) -> float:
        """When the wait for a READY conversation's first frame is over (inf: none waits)."""
        return min((lease.ready_since + self.first_frame_timeout for lease in self.table.ready()), default=math.inf)

    def _first_steps(self, now: float) -> list[EngineLease]:
        """The READY conversations due their first step: their caller's first frame is in, or waited for long
        enough."""
        return [
            lease
            for lease in self.table.ready()
            if lease.has_input_frame or now - lease.ready_since >= self.first_frame_timeout
        ]

    def stop(self) -> None:
        """No conversation is live: no more ticks until :meth:`start_grid`."""
        self.deadline = None

    async def wait_for_tick(self) -> TickStart:
        """Until the tick may start: an early start, its deadline, then maybe a grace for a due page."""
        assert self.deadline is not None
        deadline = self.deadline
        if self.early_start > 0:
            await self.sleep_until(deadline - self.early_start)
            if any(lease.skips_silence_next for lease in self.table.live()):
                await self.sleep_until(deadline)  # (its catch-up reaches the frame that lands before the deadline)
            else:
                awaited, some_frame = self._missing_frames()
                await self._wait_frames(awaited, deadline, some_frame=some_frame)
        else:
            await self.sleep_until(deadline)
        now = self._clock()
        start = TickStart(late=max(0.0, now - deadline), early=max(0.0, deadline - now))
        if self._grace_allowed(now, deadline):
            awaited = {lease for lease in self.table.live() if self._due_page(lease, now)}
            if awaited:
                self._held.append(self.ticks)
                self._ticks_held += 1
                await self._wait_frames(awaited, deadline + self.input_grace)
                start.held = self._clock() - now
        start.first_steps = self._first_steps(self._clock())
        return start

    def tick_done(self, arrivals: Sequence[tuple[EngineLease, float | None]], began: float) -> int:
        """After a tick that began at ``began`` and took each live lease's frame (when its last sample arrived;
        None: it had none): steer, set the next deadline.  Returns the ticks skipped to catch up (0 mostly)."""
        assert self.deadline is not None
        self.ticks += 1
        slacks = [self.deadline - arrived for _, arrived in arrivals if arrived is not None]
        missed = [lease for lease, arrived in arrivals if arrived is None and self._streaming(lease, began)]
        step = self.steering.adjust(slacks, self._late_pages(missed, began))
        self.deadline += self.period + step
        behind = self._clock() - self.deadline
        skipped = 0
        if behind >= self.period:
            skipped = int(behind // self.period)
            self.deadline += skipped * self.period
            self.ticks_skipped += skipped
        return skipped

    def time_free(self) -> float:
        """Seconds an engine call between ticks may take now (a period without a grid; 0 when there is no
        room before the next tick may start)."""
        if self.deadline is None:
            return self.period
        return max(0.0, self.deadline - self.early_start - WORK_MARGIN - self._clock())

    # -- who streams, whose page is due, which misses were late pages ----------------------------------

    def _streaming(self, lease: EngineLease, now: float) -> bool:
        """It sent input recently, so a tick without its frame came too early."""
        return bool(lease.frames_consumed) and now - lease.last_input_arrival < 2 * self.period

    def _due_page(self, lease: EngineLease, now: float) -> bool:
        """Aligned and still streaming, its frame ends at a page that is due about now."""
        return lease.awaits_page and now - lease.last_input_arrival < self.period

    def _late_pages(self, missed: list[EngineLease], now: float) -> int:
        """How many of the previous tick's misses were late pages (their next audio came after that tick,
        within a period of it: the steering reacts a tick later than it would have); remembers this tick's."""
        late = sum(
            self._missed_at < lease.last_input_arrival <= self._missed_at + self.period for lease in self._missed
        )
        self._missed, self._missed_at = missed, now
        return late

    def _grace_allowed(self, now: float, deadline: float) -> bool:
        while self._held and self._held[0] <= self.ticks - self.grace_window:
            self._held.popleft()
        return self.input_grace > 0 and now < deadline + self.input_grace and len(self._held) < GRACE_PER_WINDOW

    def _missing_frames(self) -> tuple[set[EngineLease], bool]:
        """The streaming live leases still short of a frame, and whether any live lease has one."""
        now = self._clock()
        awaited: set[EngineLease] = set()
        some_frame = False
        for lease in self.table.live():
            if lease.has_input_frame:
                some_frame = True
            elif self._streaming(lease, now):
                awaited.add(lease)
        return awaited, some_frame

    # -- frames arriving -------------------------------------------------------

    async def _wait_frames(self, awaited: set[EngineLease], until: float, *, some_frame: bool = True) -> None:
        """Until every lease in ``awaited`` has a frame (and, with ``some_frame=False``, some lease has one)."""
        self._awaited, self._some_frame = awaited, some_frame
        self._frames_in = trio.Event()
        try:
            if awaited or not some_frame:
                with trio.move_on_at(until):
                    await self._frames_in.wait()
        finally:
            self._awaited = None

    def input_arrived(self, lease: EngineLease, samples: int, arrived_at: float) -> None:
        """A push of ``samples`` (0: audio kept from before it was live): it may complete a frame that a wait is
        for, and a first page after a handshake tells the clients' reaction."""
        if samples and lease in self._handshakes and arrived_at >= self._handshakes[lease]:
            self._observe_reaction(self._handshakes.pop(lease), arrived_at, samples / SAMPLE_RATE)
        awaited = self._awaited
        if awaited is None or not lease.has_input_frame:
            return
        self._some_frame = True
        awaited.discard(lease)
        if not awaited:
            self._frames_in.set()

    def forget(self, lease: EngineLease) -> None:
        """The lease is over: nothing of it is waited for any more."""
        self._handshakes.pop(lease, None)

    # -- the handshake -----------------------------------------------------------

    async def sleep_until_handshake(self, lease: EngineLease) -> None:
        """Sleep until the handshake's lead before one of the next ticks (at most a period; at once without a
        grid); its first page after it is timed.

        A client that starts streaming when it gets the handshake (the official one does) sends its pages
        at the phase of that moment, for good: sent ``margin`` + the clients' reaction before a tick, its
        pages land just ahead of the ticks that take them.
        """
        if self.deadline is not None:
            lead = self.steering.margin + self.reaction
            now = self._clock()
            target = self.deadline - lead
            target += math.ceil((now - target) / self.period) * self.period
            await self.sleep_until(target)
        self._handshakes[lease] = self._clock()

    def _observe_reaction(self, handshake_sent: float, first_page_arrived: float, page_seconds: float) -> None:
        """A client's first page after the handshake: it began recording when the handshake reached it."""
        reaction = first_page_arrived - handshake_sent - page_seconds
        self._reactions.append(min(max(reaction, 0.0), MAX_REACTION))
        self.reaction = statistics.median(self._reactions)

    def snapshot(self) -> ScheduleSnapshot:
        """What it knows now, as a frozen record."""
        return ScheduleSnapshot(
            running=self.running,
            deadline=self.deadline,
            ticks=self.ticks,
            ticks_skipped=self.ticks_skipped,
            ticks_held=self._ticks_held,
            margin=self.steering.margin,
            moved=self.steering.moved,
            reaction=self.reaction,
        )
