"""The tick schedule's parts (phase steering, late pages, the clients' reaction, the time free between ticks)
and the work between ticks (its cost model, its share, when a call may start, starving work).

The schedule as a whole (the grid, early start, grace, work between ticks
never making a tick late) is tested through the actor (``test_actor.py``).
"""

import dataclasses

import pytest

from pplex_trio.engine._schedule import DEFAULT_REACTION, MAX_REACTION, TickSchedule
from pplex_trio.engine._settings import ActorSettings
from pplex_trio.engine._slots import SlotTable
from pplex_trio.engine._steering import PhaseSteering
from pplex_trio.engine._work import BetweenTicks, WorkCost, share

TICK = 0.080
# The windows at 80 ms ticks: 10 s and 6 s of steering (steering_window, steering_calm), 2 s of starving work.
STEERING_TICKS = {"window": 125, "calm_ticks": 75}
STARVED_TICKS = 25


def steering(**options) -> PhaseSteering:
    return PhaseSteering(**{**STEERING_TICKS, **options})


def test_moves_earlier_by_a_fraction_of_the_smallest_spare_slack():
    steer = steering(margin=0.004, gain=0.25, max_step=0.005)
    assert steer.adjust([0.020, 0.012, 0.030], late=0) == pytest.approx(-0.25 * (0.012 - 0.004))


def test_step_is_capped():
    assert steering(max_step=0.005).adjust([0.070], late=0) == pytest.approx(-0.005)


def test_no_move_when_some_conversation_has_no_spare_slack():
    assert steering(margin=0.004).adjust([0.030, 0.003], late=0) == 0.0
    assert steering().adjust([], late=0) == 0.0


def test_a_late_conversation_moves_the_grid_later_and_widens_the_margin():
    steer = steering(margin=0.008, late_step=0.004, window=5)
    assert steer.adjust([0.050], late=1) == pytest.approx(0.004)
    assert steer.margin == pytest.approx(0.010)
    # Then earlier only once a whole window has been seen again (a few ticks are no measure of a rhythm).
    assert [steer.adjust([0.013], late=0) for _ in range(4)] == [0.0] * 4
    assert steer.adjust([0.013], late=0) == pytest.approx(-0.25 * (0.013 - 0.010))


def test_a_page_that_comes_close_to_its_tick_every_4_s_keeps_the_grid_from_moving_past_it():
    """(As soxr's blocks against 100 ms messages did, and a jittery network's late pages do.)  A 2 s window
    forgot it between two, moved the grid past it and missed it each time."""
    steer = steering(margin=0.003, gain=1.0)
    misses = 0
    for tick in range(1500):  # 2 minutes
        slack = (0.020 if tick % 50 else 0.001) + steer.moved  # on the original grid
        late = int(slack < 0)
        misses += late
        steer.adjust([] if late else [slack], late=late)
    assert misses == 0 and -0.002 - 1e-9 <= steer.moved <= 0


def test_calm_narrows_the_margin_back_slowly():
    steer = steering(margin=0.008, calm_ticks=10)
    for _ in range(3):
        steer.adjust([0.0], late=1)
    assert steer.margin == pytest.approx(0.014)
    for _ in range(30):
        steer.adjust([0.0], late=0)
    assert steer.margin == pytest.approx(0.011)


def test_one_calm_tick_does_not_pull_the_grid_into_jittery_pages():
    """The spare slack is the smallest of the recent ticks, on today's grid."""
    steer = steering(margin=0.006, gain=0.25, max_step=0.005, window=5)
    steer.adjust([0.007], late=0)  # a page that came close to its tick
    step = steer.adjust([0.030], late=0)  # then a calm tick
    assert -0.001 < step < 0  # still ruled by the close one, not by 24 ms of seeming spare
    for _ in range(5):  # calm ticks only: the close page leaves the window
        step = steer.adjust([0.030 + steer.moved], late=0)
    assert step < -0.003  # now the grid moves in earnest


def test_the_window_accounts_for_moves_already_made():
    steer = steering(margin=0.006, gain=1.0, max_step=0.005, window=50)
    total = 0.0
    for _ in range(20):  # pages always arrive 20 ms before the tick on the original grid
        total += steer.adjust([0.020 + total], late=0)
    assert total == pytest.approx(-0.014, abs=1e-9)  # stops at the margin, no overshoot


@dataclasses.dataclass(eq=False)
class FakeLease:
    last_input_arrival: float
    frames_consumed: int = 1


def _schedule(now=lambda: 0.0) -> TickSchedule:
    return TickSchedule(SlotTable(2, queue_size=0), ActorSettings(input_grace_ms=4, early_start_ms=10), clock=now)


def test_a_miss_whose_page_came_within_a_tick_is_late():
    schedule = _schedule()
    jittery, stopped, paused = FakeLease(0.95), FakeLease(0.95), FakeLease(0.95)
    assert schedule._late_pages([jittery, stopped, paused], now=1.0) == 0  # judged at the next tick
    jittery.last_input_arrival = 1.03  # its page, 30 ms after the tick that missed it
    paused.last_input_arrival = 1.20  # back after a pause longer than a tick
    assert schedule._late_pages([], now=1.08) == 1  # and the stopped one never sent again


def test_each_tick_is_judged_once_and_a_new_grid_forgets():
    now = [1.0]
    schedule = _schedule(lambda: now[0])
    lease = FakeLease(0.95)
    schedule._late_pages([lease], now=1.0)
    lease.last_input_arrival = 1.01
    assert schedule._late_pages([], now=1.08) == 1
    assert schedule._late_pages([], now=1.16) == 0
    schedule._late_pages([lease], now=2.0)
    schedule.start_grid()
    lease.last_input_arrival = 2.01
    assert schedule._late_pages([], now=2.08) == 0


def test_a_tick_without_the_frame_of_a_conversation_still_streaming_is_a_miss():
    schedule = _schedule(lambda: 1.0)
    schedule.start_grid()
    streaming, stopped, silent = FakeLease(0.95), FakeLease(0.80), FakeLease(0.99, frames_consumed=0)
    schedule.tick_done([(streaming, None), (stopped, None), (silent, None)], began=1.0)
    assert schedule._missed == [streaming]  # sent within two periods; the others stopped or never began


def test_the_reaction_is_the_median_of_recent_clients_beyond_the_pages_audio():
    schedule = _schedule()
    assert schedule.reaction == DEFAULT_REACTION
    for handshake, first_page in [(1.0, 1.045), (2.0, 2.041), (3.0, 3.043)]:
        schedule._observe_reaction(handshake, first_page, page_seconds=0.040)
    assert schedule.reaction == pytest.approx(0.003)
    schedule._observe_reaction(4.0, 4.240, page_seconds=0.040)  # one client that did not start at the handshake
    assert schedule.reaction == pytest.approx(0.003 + 0.002 / 2)  # the median moves by half a step, no more
    schedule._observe_reaction(5.0, 5.010, page_seconds=0.040)  # a page recorded before the handshake
    assert min(schedule._reactions) == 0.0 and max(schedule._reactions) == MAX_REACTION  # clamped


async def test_the_first_page_after_a_handshake_is_timed_once(autojump_clock):
    schedule = TickSchedule(SlotTable(1, queue_size=0), ActorSettings(input_grace_ms=4, early_start_ms=10))
    lease = FakeLease(0.0)
    lease.has_input_frame = False
    schedule.input_arrived(lease, 960, 0.0)  # before any handshake: nothing to time
    await schedule.sleep_until_handshake(lease)  # (no grid: at once)
    schedule.input_arrived(lease, 960, schedule._clock() + 0.050)  # a 40 ms page, 50 ms after it
    assert schedule.reaction == pytest.approx(0.010)
    schedule.input_arrived(lease, 960, schedule._clock() + 0.500)  # its later pages tell nothing
    assert schedule.reaction == pytest.approx(0.010) and len(schedule._reactions) == 1


def test_share_splits_evenly_and_never_gives_more_than_left():
    assert share({1: 100, 2: 100}, 50) == {1: 25, 2: 25}
    assert share({1: 3, 2: 100}, 50) == {1: 3, 2: 47}
    assert share({1: 3, 2: 5}, 100) == {1: 3, 2: 5}
    assert share({1: 10, 2: 0}, 4) == {1: 4}
    assert share({1: 10, 2: 10, 3: 10}, 2) == {1: 1, 2: 1}  # fewer positions than rows: the first ones
    assert share({1: 10}, 0) == {}


def test_the_cost_fits_fixed_plus_per_unit_and_pads_its_estimate():
    cost = WorkCost()
    assert cost.units_within(0.0) == 0 and cost.units_within(0.01) > 10**6  # nothing known
    cost.observe(10, 0.012)  # one size only: all of it per unit (small calls overestimated: safe)
    assert cost.fixed == 0 and cost.per_unit == pytest.approx(0.0012)
    for n in (20, 40, 80, 20):
        cost.observe(n, 0.002 + 0.001 * n)
    cost.observe(10, 0.012)
    assert cost.per_unit == pytest.approx(0.001, rel=0.05) and cost.fixed == pytest.approx(0.002, abs=0.001)
    n = cost.units_within(0.050)
    assert 0.002 + 0.001 * n <= 0.050 / WorkCost.SAFETY + 1e-9 and n > 25
    assert cost.units_within(0.001) == 0  # not even the fixed cost fits


def test_time_free_leaves_the_margin_before_the_earliest_start():
    now = [10.0]
    schedule = _schedule(lambda: now[0])
    assert schedule.time_free() == TICK  # no grid: a tick's worth per call
    schedule.start_grid()
    schedule.deadline = 10.0
    assert schedule.time_free() == 0.0  # the tick is due now
    schedule.deadline = 10.080
    assert schedule.time_free() == pytest.approx(0.080 - 0.010 - 0.004)
    now[0] = 10.070
    assert schedule.time_free() == 0.0


def test_one_slow_call_does_not_starve_the_work():
    cost = WorkCost()
    for n in (10, 20, 40, 10, 20):
        cost.observe(n, 0.002 + 0.001 * n)
    cost.observe(20, 0.200)  # one call held up (a collection, a busy event loop)
    assert cost.units_within(0.050) > 20


def test_a_call_is_not_started_without_time_for_its_fixed_cost():
    """Calls of starts and resets alone (no prompt position) teach the fixed cost of a call too."""
    work = BetweenTicks(starved_ticks=STARVED_TICKS)
    for _ in range(3):
        work.prompts_done(0, 0.020)  # the trip to the worker thread and a start: 20 ms each
    assert not work.prompt_cost.known  # (nothing yet of the cost per position)
    assert not work.may_start(0.021, grid=True, tick=0)  # 21 ms left: less than 20 ms padded
    assert work.may_start(0.036, grid=True, tick=0)
    assert work.may_start(0.0, grid=False, tick=0)  # nobody live: no tick to protect


class EchoJob:
    def __init__(self, frames):
        self.frames_left = frames

    def advance(self, frames):
        self.frames_left -= frames

    def result(self):
        return b"made"


def test_a_job_that_finds_no_time_gets_a_frame_after_a_while_and_its_cost_measured_again():
    """One job call held up (a busy machine) makes a frame look dearer than any gap: without a way out, the
    job would wait for ever, since no call would measure the cost again."""
    work = BetweenTicks(starved_ticks=STARVED_TICKS)
    for _ in range(3):
        work.prompts_done(0, 0.020)  # a call's fixed cost: 20 ms
    job = EchoJob(50)
    pending = work.submit(job, tick=0)
    for n in (4, 8, 4):
        work.job_done(job, n, 0.300, tick=0, outcome=None)  # frames that looked like 75 ms each
    room = 0.026  # before the tick is due: room for a call, not for a frame at that cost
    assert work.may_start(room, grid=True, tick=0) and work.job_work(room, grid=True, tick=0) is None
    assert work.job_work(room, grid=True, tick=STARVED_TICKS - 1) is None
    tick = STARVED_TICKS
    assert not work.may_start(0.0, grid=True, tick=tick)  # the tick is due: not even a starving job runs now
    assert work.job_work(0.0, grid=True, tick=tick) is None
    assert work.may_start(0.006, grid=True, tick=tick)  # 6 ms left: too little for a call, but it has starved
    assert work.job_work(0.006, grid=True, tick=tick) == (job, 1)
    work.job_done(job, 1, 0.003, tick=tick, outcome=None)  # progress: its clock starts again
    assert not work.may_start(0.006, grid=True, tick=tick)
    for _ in range(30):  # the cheap frames it really costs teach the estimate again
        work.job_done(job, 1, 0.003, tick=tick, outcome=None)
        if (planned := work.job_work(0.050, grid=True, tick=tick)) is not None and planned[1] > 1:
            break
    assert work.job_work(0.050, grid=True, tick=tick)[1] > 1
    work.job_done(job, 0, 0.001, tick=tick, outcome=b"made")
    assert pending.done.is_set() and pending.outcome == b"made" and not work.jobs


def test_with_nobody_live_prompts_run_whatever_one_slow_call_measured():
    """A first prompt call slowed by a busy machine (here 1 s) must not stop the prompts of a server with nobody
    live: there is no tick to protect, and nothing else would ever measure the cost again."""
    work = BetweenTicks(starved_ticks=STARVED_TICKS)
    for positions in (1, 2, 4):
        work.prompts_done(positions, 1.0)
    assert work.prompt_cost.fixed * WorkCost.SAFETY > TICK
    assert work.may_start(TICK, grid=False, tick=0)
    assert work.prompt_work({0: 100}, TICK, grid=False, tick=0) == {0: 1}  # at least a position per row


def test_prompts_that_find_no_room_get_a_small_call_after_a_while():
    work = BetweenTicks(starved_ticks=STARVED_TICKS)
    for n in (10, 20, 40):
        work.prompts_done(n, 0.002 + 0.010 * n)  # 10 ms a position
    assert work.prompt_work({0: 100, 1: 100}, 0.005, grid=True, tick=0) == {}  # no room: nothing
    assert not work.may_start(0.0, grid=True, tick=STARVED_TICKS - 1)
    assert work.may_start(0.0, grid=True, tick=STARVED_TICKS)  # starved: even at the tick's cost
    assert work.prompt_work({0: 100, 1: 100}, 0.0, grid=True, tick=STARVED_TICKS) == {0: 1, 1: 1}  # a position each
    assert not work.may_start(0.0, grid=True, tick=STARVED_TICKS)  # (it ran: not starved any more)
