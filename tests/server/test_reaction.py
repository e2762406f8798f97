"""The handshake lead learns how long clients take to send their first page."""

import pytest

from pplex_trio.server._reaction import DEFAULT_REACTION, MAX_REACTION, ClientReaction


def test_default_before_any_client():
    assert ClientReaction().estimate == DEFAULT_REACTION


def test_median_of_recent_clients_beyond_the_pages_audio():
    reaction = ClientReaction(window=3)
    for handshake, first_page in [(1.0, 1.045), (2.0, 2.041), (3.0, 3.043)]:
        reaction.observe(handshake, first_page, page_seconds=0.040)
    assert reaction.estimate == pytest.approx(0.003)
    reaction.observe(4.0, 4.240, page_seconds=0.040)  # one client that did not start at the handshake ...
    assert reaction.estimate == pytest.approx(0.003)  # ... does not move the median (window of 3: 1, 3, 20 ms)


def test_clamped_to_a_plausible_range():
    reaction = ClientReaction(window=1)
    reaction.observe(1.0, 1.010, page_seconds=0.040)  # a page recorded before the handshake
    assert reaction.estimate == 0.0
    reaction.observe(2.0, 3.0, page_seconds=0.040)
    assert reaction.estimate == MAX_REACTION
