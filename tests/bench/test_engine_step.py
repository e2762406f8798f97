"""``bench/engine_step.py`` runs on CPU and prints a table that parses.

Tiny sizes and few ticks: this checks the benchmark works, not how fast
anything is (no timing assertions).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
BENCH = REPO / "bench" / "engine_step.py"


def run_bench(*args: str) -> tuple[list[str], list[dict[str, str]]]:
    """Run the benchmark; return its comment lines and its table rows (header -> cell)."""
    done = subprocess.run(
        [sys.executable, str(BENCH), *args], cwd=REPO, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    comments = [line for line in lines if line.startswith("#")]
    table = [line.split() for line in lines if not line.startswith("#")]
    header, rows = table[0], table[1:]
    assert all(len(row) == len(header) for row in rows), done.stdout
    return comments, [dict(zip(header, row, strict=True)) for row in rows]


def check_times(row: dict[str, str], side: str) -> None:
    p50, p99 = float(row[f"{side}_p50_ms"]), float(row[f"{side}_p99_ms"])
    assert 0 < p50 <= p99


@pytest.mark.oracle
def test_cpu_table_ours_and_moshi_side_by_side() -> None:
    pytest.importorskip("moshi")
    comments, rows = run_bench("--batch-sizes", "1,2", "--iters", "3", "--warmup", "1")
    assert any("command: python bench/engine_step.py" in c for c in comments)
    assert [int(r["B"]) for r in rows] == [1, 2]
    for row in rows:
        check_times(row, "ours")
        check_times(row, "moshi")
        ratio = float(row["ours_p50_ms"]) / float(row["moshi_p50_ms"])
        assert float(row["ratio"]) == pytest.approx(ratio, abs=0.011)


def test_named_config_with_random_weights() -> None:
    """The path the GPU run takes (named config, random weights, ours only), here with the tiny config."""
    _, rows = run_bench("--config", "tiny", "--random-weights", "--batch-sizes", "3", "--iters", "2", "--warmup", "1")
    assert [int(r["B"]) for r in rows] == [3]
    assert "moshi_p50_ms" not in rows[0]
    check_times(rows[0], "ours")
