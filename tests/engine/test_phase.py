"""PhaseSteering: how far the tick grid moves, from the conversations' slack."""

import pytest

from pplex_trio.engine._phase import PhaseSteering


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
