"""bench/encoder_handoff.py: each placement is measured on the encoder pool the server uses."""

import importlib.util
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("bench_encoder_handoff", ROOT / "bench" / "encoder_handoff.py")
handoff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(handoff)


@pytest.mark.serial  # timing-bound: a frame per stream a tick only holds on an unloaded machine
def test_a_short_run_measures_every_placement_where_its_encoding_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(handoff, "RESULTS", tmp_path)
    assert handoff.main(["--streams", "8", "--duration", "2", "--warmup", "0.5", "--rounds", "1", "--name", "t"]) == 0
    rows = {r["placement"]: r for r in json.loads((tmp_path / "t.json").read_text())["results"]}
    assert list(rows) == ["none", "inline", "process"]
    assert all(11.5 <= r["frames_per_s_per_stream"] <= 13.5 for r in rows.values())  # a frame per stream a tick
    # The child's CPU shows only where the child encodes.  (200 frames of libopus are 10-40 ms of CPU, and the
    # kernel counts a process's CPU in 10 ms ticks: 50 µs a frame a tick, so more than 0 is what can be asked.)
    assert rows["process"]["child_us_per_frame"] > 0
    assert rows["none"]["child_us_per_frame"] == rows["inline"]["child_us_per_frame"] == 0
