"""The tick schedule's parts: phase steering, late pages, the clients' reaction, the prompts' cost and share.

The schedule as a whole (the grid, early start, grace, prompts between ticks
never making a tick late) is tested through the actor (``test_actor.py``).
"""

import dataclasses

import pytest

from pplex_trio.engine._schedule import DEFAULT_REACTION, MAX_REACTION, PromptCost, TickSchedule, share
from pplex_trio.engine._steering import LatePages, PhaseSteering
from pplex_trio.engine._slots import SlotTable

TICK = 0.080


def test_moves_earlier_by_a_fraction_of_the_smallest_spare_slack():
    steer = PhaseSteering(margin=0.004, gain=0.25, max_step=0.005)
    assert steer.adjust([0.020, 0.012, 0.030], late=0) == pytest.approx(-0.25 * (0.012 - 0.004))


def test_step_is_capped():
    assert PhaseSteering(max_step=0.005).adjust([0.070], late=0) == pytest.approx(-0.005)


def test_no_move_when_some_conversation_has_no_spare_slack():
    assert PhaseSteering(margin=0.004).adjust([0.030, 0.003], late=0) == 0.0
    assert PhaseSteering().adjust([], late=0) == 0.0


def test_a_late_conversation_moves_the_grid_later_and_widens_the_margin():
    steer = PhaseSteering(margin=0.008, late_step=0.004)
    assert steer.adjust([0.050], late=1) == pytest.approx(0.004)
    assert steer.margin == pytest.approx(0.010)
    assert steer.adjust([0.013], late=0) == pytest.approx(-0.25 * (0.013 - 0.010))


def test_calm_narrows_the_margin_back_slowly():
    steer = PhaseSteering(margin=0.008, calm_ticks=10)
    for _ in range(3):
        steer.adjust([0.0], late=1)
    assert steer.margin == pytest.approx(0.014)
    for _ in range(30):
        steer.adjust([0.0], late=0)
    assert steer.margin == pytest.approx(0.011)


def test_one_calm_tick_does_not_pull_the_grid_into_jittery_pages():
    """The spare slack is the smallest of the recent ticks, on today's grid."""
    steer = PhaseSteering(margin=0.006, gain=0.25, max_step=0.005, window=5)
    steer.adjust([0.007], late=0)  # a page that came close to its tick
    step = steer.adjust([0.030], late=0)  # then a calm tick
    assert -0.001 < step < 0  # still ruled by the close one, not by 24 ms of seeming spare
    for _ in range(5):  # calm ticks only: the close page leaves the window
        step = steer.adjust([0.030 + steer.moved], late=0)
    assert step < -0.003  # now the grid moves in earnest


def test_the_window_accounts_for_moves_already_made():
    steer = PhaseSteering(margin=0.006, gain=1.0, max_step=0.005, window=50)
    total = 0.0
    for _ in range(20):  # pages always arrive 20 ms before the tick on the original grid
        total += steer.adjust([0.020 + total], late=0)
    assert total == pytest.approx(-0.014, abs=1e-9)  # stops at the margin, no overshoot


@dataclasses.dataclass(eq=False)
class FakeLease:
    last_input_arrival: float


def test_a_miss_whose_page_came_within_a_tick_is_late():
    late = LatePages(TICK)
    jittery, stopped, paused = FakeLease(0.95), FakeLease(0.95), FakeLease(0.95)
    assert late.confirm([jittery, stopped, paused], now=1.0) == 0  # judged at the next tick
    jittery.last_input_arrival = 1.03  # its page, 30 ms after the tick that missed it
    paused.last_input_arrival = 1.20  # back after a pause longer than a tick
    assert late.confirm([], now=1.08) == 1  # and the stopped one never sent again


def test_each_tick_is_judged_once_and_a_restart_forgets():
    late = LatePages(TICK)
    lease = FakeLease(0.95)
    late.confirm([lease], now=1.0)
    lease.last_input_arrival = 1.01
    assert late.confirm([], now=1.08) == 1
    assert late.confirm([], now=1.16) == 0
    late.confirm([lease], now=2.0)
    late.forget()
    lease.last_input_arrival = 2.01
    assert late.confirm([], now=2.08) == 0


def _schedule() -> TickSchedule:
    return TickSchedule(SlotTable(2, queue_size=0), TICK, input_grace=0.004, early_start=0.010, clock=lambda: 0.0)


def test_the_reaction_is_the_median_of_recent_clients_beyond_the_pages_audio():
    schedule = _schedule()
    assert schedule.reaction == DEFAULT_REACTION
    for handshake, first_page in [(1.0, 1.045), (2.0, 2.041), (3.0, 3.043)]:
        schedule.observe_reaction(handshake, first_page, page_seconds=0.040)
    assert schedule.reaction == pytest.approx(0.003)
    schedule.observe_reaction(4.0, 4.240, page_seconds=0.040)  # one client that did not start at the handshake
    assert schedule.reaction == pytest.approx(0.003 + 0.002 / 2)  # the median moves by half a step, no more
    schedule.observe_reaction(5.0, 5.010, page_seconds=0.040)  # a page recorded before the handshake
    assert min(schedule._reactions) == 0.0 and max(schedule._reactions) == MAX_REACTION  # clamped


def test_share_splits_evenly_and_never_gives_more_than_left():
    assert share({1: 100, 2: 100}, 50) == {1: 25, 2: 25}
    assert share({1: 3, 2: 100}, 50) == {1: 3, 2: 47}
    assert share({1: 3, 2: 5}, 100) == {1: 3, 2: 5}
    assert share({1: 10, 2: 0}, 4) == {1: 4}
    assert share({1: 10, 2: 10, 3: 10}, 2) == {1: 1, 2: 1}  # fewer positions than rows: the first ones
    assert share({1: 10}, 0) == {}


def test_prompt_cost_fits_fixed_plus_per_position_and_pads_its_estimate():
    cost = PromptCost()
    assert cost.positions_within(0.0) == 0 and cost.positions_within(0.01) > 10**6  # nothing known
    cost.observe(10, 0.012)  # one size only: all of it per position (small calls overestimated: safe)
    assert cost.fixed == 0 and cost.per_position == pytest.approx(0.0012)
    for n in (20, 40, 80, 20):
        cost.observe(n, 0.002 + 0.001 * n)
    cost.observe(10, 0.012)
    assert cost.per_position == pytest.approx(0.001, rel=0.05) and cost.fixed == pytest.approx(0.002, abs=0.001)
    n = cost.positions_within(0.050)
    assert 0.002 + 0.001 * n <= 0.050 / PromptCost.SAFETY + 1e-9 and n > 25
    assert cost.positions_within(0.001) == 0  # not even the fixed cost fits


def test_prompt_time_leaves_the_margin_before_the_earliest_start():
    now = [10.0]
    schedule = TickSchedule(SlotTable(2, queue_size=0), TICK, input_grace=0.004, early_start=0.010,
                            clock=lambda: now[0])
    assert schedule.prompt_time() == TICK  # no grid: a tick's worth per call
    schedule.start(10.0)
    assert schedule.prompt_time() == 0.0  # the tick is due now
    schedule.deadline = 10.080
    assert schedule.prompt_time() == pytest.approx(0.080 - 0.010 - 0.004)
    now[0] = 10.070
    assert schedule.prompt_time() == 0.0


def test_one_slow_call_does_not_starve_the_prompts():
    cost = PromptCost()
    for n in (10, 20, 40, 10, 20):
        cost.observe(n, 0.002 + 0.001 * n)
    cost.observe(20, 0.200)  # one call held up (a collection, a busy event loop)
    assert cost.positions_within(0.050) > 20


def test_a_call_is_not_started_without_time_for_its_fixed_cost():
    """Calls of starts and resets alone (no prompt position) teach the fixed cost of a call too."""
    now = [10.0]
    schedule = TickSchedule(SlotTable(2, queue_size=0), TICK, input_grace=0.004, early_start=0.010,
                            clock=lambda: now[0])
    schedule.start(10.080)
    for _ in range(3):
        schedule.prompt_done(0, 0.020)  # the trip to the worker thread and a start: 20 ms each
    assert not schedule.prompt_cost.known  # (nothing yet of the cost per position)
    now[0] = 10.045  # 80 - 10 - 4 - 45 = 21 ms left: less than 20 ms padded
    assert not schedule.may_run_prompts()
    now[0] = 10.030  # 36 ms left
    assert schedule.may_run_prompts()


def test_a_voice_that_finds_no_time_gets_a_frame_after_a_while_and_its_cost_measured_again():
    """One voice call held up (a busy machine) makes a frame look dearer than any gap: without a way out, the
    voice would wait for ever, since no call would measure the cost again."""
    from pplex_trio.engine._schedule import PROMPT_STARVED_TICKS

    now = [10.0]
    schedule = TickSchedule(SlotTable(2, queue_size=0), TICK, input_grace=0.004, early_start=0.010,
                            clock=lambda: now[0])
    schedule.start(10.080)
    for _ in range(3):
        schedule.prompt_done(0, 0.020)  # a call's fixed cost: 20 ms
    for n in (4, 8, 4):
        schedule.voice_done(n, 0.300)  # frames that looked like 75 ms each
    now[0] = 10.040  # 26 ms before the tick is due: room for a call, not for a frame at that cost
    assert schedule.voice_work(50) == 0
    for _ in range(PROMPT_STARVED_TICKS - 1):
        schedule.ticks += 1
        assert schedule.voice_work(50) == 0
    schedule.ticks += 1
    now[0] = 10.066  # the tick is due: not even a starving voice runs now
    assert not schedule.may_run_prompts(voice_waiting=True) and schedule.voice_work(50) == 0
    now[0] = 10.060  # 6 ms left: too little for a call, but the voice has starved long enough
    assert schedule.may_run_prompts(voice_waiting=True) and schedule.voice_work(50) == 1
    assert not schedule.may_run_prompts()  # (with no voice waiting, no call: and its clock starts again)
    now[0] = 10.0
    for _ in range(30):  # the cheap frames it really costs teach the estimate again
        schedule.voice_done(1, 0.003)
        if schedule.voice_work(50) > 1:
            break
    assert schedule.voice_work(50) > 1


def test_with_nobody_live_prompts_run_whatever_one_slow_call_measured():
    """A first prompt call slowed by a busy machine (here 1 s) must not stop the prompts of a server with nobody
    live: there is no tick to protect, and nothing else would ever measure the cost again."""
    schedule = TickSchedule(SlotTable(2, queue_size=0), TICK, input_grace=0.004, early_start=0.010, clock=lambda: 0.0)
    for positions in (1, 2, 4):
        schedule.prompt_done(positions, 1.0)
    assert schedule.deadline is None and schedule.prompt_cost.fixed * 1.25 > TICK
    assert schedule.may_run_prompts()
    assert schedule.prompt_work({0: 100}) == {0: 1}  # at least a position per row
