"""PhaseSteering: how far the tick grid moves, from the conversations' slack."""

import pytest

from pplex_trio.engine._phase import PhaseSteering


def test_moves_earlier_by_a_fraction_of_the_smallest_spare_slack():
    steer = PhaseSteering(target=0.004, gain=0.25, max_step=0.005)
    assert steer.adjust([0.020, 0.012, 0.030], late=0) == pytest.approx(-0.25 * (0.012 - 0.004))


def test_step_is_capped():
    assert PhaseSteering(max_step=0.005).adjust([0.070], late=0) == pytest.approx(-0.005)


def test_no_move_when_some_conversation_has_no_spare_slack():
    assert PhaseSteering(target=0.004).adjust([0.030, 0.003], late=0) == 0.0
    assert PhaseSteering().adjust([], late=0) == 0.0


def test_a_late_conversation_moves_the_grid_later():
    steer = PhaseSteering(late_step=0.002)
    assert steer.adjust([0.050], late=1) == pytest.approx(0.002)
    assert steer.moved == pytest.approx(0.002)
