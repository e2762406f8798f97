"""``bench/ready.py``'s arithmetic (the measurements themselves need two servers: see docs/BENCHMARKS.md)."""

from __future__ import annotations

import sys

import numpy as np

from tests.bench.test_engine_step import REPO

sys.path.insert(0, str(REPO / "bench"))

import ready  # noqa: E402


def test_personas_are_cut_at_a_word_near_their_length():
    for chars in ready.PERSONA_LENGTHS:
        text = ready.persona(chars)
        assert chars - 15 <= len(text) <= chars and not text.endswith(" ")
        assert ready.TEXT.startswith(text[:40])


def test_best_match_finds_a_frame_in_its_echo_and_not_elsewhere():
    rng = np.random.RandomState(0)
    speech = rng.randn(24_000).astype(np.float32) * 0.1
    frame = speech[5000:6920]
    echo = np.concatenate([np.zeros(3000, np.float32), speech[:9000], np.zeros(100, np.float32)])
    assert ready.best_match(frame, echo) > 0.999  # a delayed copy
    assert ready.best_match(frame, np.concatenate([speech[:4000], speech[8000:]])) < 0.5  # cut out: not heard
    assert ready.best_match(frame, np.zeros(10_000, np.float32)) == 0.0  # silence never matches
