"""``bench/voices.py``'s arithmetic and its reference way of making a voice (the figures: docs/BENCHMARKS.md)."""

from __future__ import annotations

import sys

from pplex_trio import _metrics
from tests.bench.test_engine_step import REPO

sys.path.insert(0, str(REPO / "bench"))

import voices  # noqa: E402
from _metrics import Histogram  # noqa: E402


def test_ticks_over_5_ms_are_counted_from_the_cumulative_buckets():
    assert 0.005 in _metrics._LATENESS_BUCKETS  # the bound the benchmark reads
    h = Histogram([0.001, 0.005, 0.010, float("inf")], [3.0, 5.0, 6.0, 7.0])
    assert voices._over(h, 0.005) == 2.0
    assert voices._over(Histogram([0.005, float("inf")], [4.0, 4.0]), 0.005) == 0.0


def test_the_table_shows_the_ratio_and_the_live_figures():
    result = {
        "cost": [
            {
                "model": "tiny",
                "clip_s": 4.0,
                "read_normalise_ms_per_s": 1.0,
                "ours_ms_per_s": 80.0,
                "reference_way_ms_per_s": 100.0,
            }
        ],
        "live": {
            "live": 1,
            "voices": 10,
            "added": 10,
            "statuses": [201],
            "adding_s": 12.0,
            "upload_p50_s": 5.0,
            "upload_max_s": 6.0,
            "ticks_measured": [250, 160],
            "lateness_p99_ms_alone": 0.5,
            "lateness_p99_ms_while_adding": 0.7,
            "ticks_over_5ms_alone": 0,
            "ticks_over_5ms_while_adding": 1,
        },
    }
    text = voices.table(result)
    assert "    0.80" in text.splitlines()[2]  # 80 / 100
    assert "10 added, statuses [201]" in text and text.splitlines()[-1].split()[-1] == "1"
