"""In CI a test skipped for want of what ``.ci/setup --test`` installs fails; elsewhere it is a skip."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent


def run(ci: bool) -> str:
    folder = REPO / "tests" / f"_ci_skip_check_{os.getpid()}"  # (under tests/, for its conftest)
    folder.mkdir()
    try:
        (folder / "test_needs.py").write_text(
            "import pytest\n"
            "def test_needs_moshi():\n    pytest.importorskip('moshi_that_is_not_installed')\n"
            "def test_skipped_for_its_own_reason():\n    pytest.skip('not on this platform')\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "PPLEX_TRIO_CI"} | ({"PPLEX_TRIO_CI": "1"} if ci else {})
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    finally:
        shutil.rmtree(folder)


def test_a_missing_test_dependency_fails_in_ci_and_skips_elsewhere():
    assert "1 failed, 1 skipped" in run(ci=True)
    assert "2 skipped" in run(ci=False)
