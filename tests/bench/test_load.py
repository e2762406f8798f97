"""bench/load: its percentile arithmetic, its pre-encoded stream, and a short real run."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from _metrics import Histogram  # noqa: E402


def test_histogram_quantile_interpolates_like_prometheus():
    rng = np.random.default_rng(0)
    samples = rng.uniform(0, 0.1, 100_000)
    bounds = [0.01 * k for k in range(1, 11)] + [float("inf")]
    counts = [float((samples <= b).sum()) for b in bounds]
    hist = Histogram(bounds, counts)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert hist.quantile(q) == pytest.approx(np.quantile(samples, q), abs=0.002)
    empty = Histogram(bounds, [0.0] * len(bounds))
    assert np.isnan(empty.quantile(0.5))


def test_pre_encoded_stream_starts_with_its_headers():
    from load import encode_pages

    from _helpers.ogg import is_bos, page_sequence

    pages = encode_pages(2.0, 40)
    assert is_bos(pages[0]) and pages[0][28:36] == b"OpusHead"
    assert [page_sequence(p) for p in pages] == list(range(len(pages)))
    assert len(pages) == 2 + 2 * 25  # headers + two 40 ms pages per 80 ms frame


@pytest.mark.serial
def test_short_load_run_reports_every_session(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/load.py", "--clients", "2", "--duration", "2", "--warmup", "1", "--name", "smoke",
         "--results", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "smoke.json").read_text())
    result = report["results"][0]
    assert result["sessions_ok"] == 2
    assert result["received_frames"] > 0 and result["sent_frames"] > 0
    assert "real time" in proc.stdout
    assert (tmp_path / "smoke.png").stat().st_size > 0


@pytest.mark.serial
def test_the_protocols_side_by_side(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/load.py", "--clients", "2", "--duration", "2", "--warmup", "1", "--compare-protocols",
         "--name", "protocols", "--results", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    moshi, realtime = json.loads((tmp_path / "protocols.json").read_text())["results"]
    assert moshi["label"].startswith("moshi") and realtime["label"].startswith("realtime")
    for result in (moshi, realtime):
        assert result["sessions_ok"] == 2 and result["received_frames"] > 0.8 * result["sent_frames"] > 0
    assert "server CPU per conversation-second: moshi" in proc.stdout and "ratio" in proc.stdout
