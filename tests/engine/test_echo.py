"""The echo test engine's text share: a speaking model's text rate, spread evenly."""

import numpy as np
import pytest

from pplex_trio.engine import EchoEngine
from pplex_trio.engine._interface import SlotMode


@pytest.mark.parametrize("share, expected", [(1.0, 100), (0.3, 30), (0.0, 0)])
def test_text_on_the_share_of_frames_asked_for(share, expected):
    engine = EchoEngine(1, text_share=share)
    pieces = [engine.step([SlotMode.LIVE], np.zeros((1, 1920), np.float32)).text[0] for _ in range(100)]
    numbered = [i for i, piece in enumerate(pieces) if piece is not None]
    assert len(numbered) == expected
    assert all(pieces[i] == f" {i}" for i in numbered)  # the piece still names its frame
    if 0 < share < 1:
        gaps = np.diff(numbered)
        assert gaps.max() - gaps.min() <= 1  # evenly spread, not in bursts


def test_a_share_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="text_share"):
        EchoEngine(1, text_share=1.5)
