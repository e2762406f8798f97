"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import pathlib

import pytest

from _helpers.virtual_server import VirtualServers

REPO = pathlib.Path(__file__).resolve().parent.parent
# Real speech and golden data live beside the checkout, on every developer
# machine and in CI (see the developers' guide); tests never copy them in.
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    if not SHARED.is_dir():
        pytest.fail(f"shared data folder not found at {SHARED}: check out the project beside ../shared")
    return SHARED


@pytest.fixture(scope="session")
def golden_dir(shared_dir: pathlib.Path) -> pathlib.Path:
    return shared_dir / "golden" / "tiny-public"


@pytest.fixture
def virtual_server(nursery, monkeypatch, tmp_path) -> VirtualServers:
    """``await virtual_server(engine=None, *, prefill_steps=2, delay_frames=1, compute_seconds=0, **settings)`` →
    the real server on an in-memory network, run in the test's own Trio run (a ``VirtualServer``: its handle,
    and clients that reach it).  The test asks for ``autojump_clock`` too: see ``_helpers/virtual_server.py``."""
    return VirtualServers(nursery, monkeypatch, tmp_path)


@pytest.fixture(scope="session")
def speech_wav(shared_dir: pathlib.Path) -> pathlib.Path:
    return shared_dir / "data" / "speech_assistant.wav"


# What `.ci/setup --test` installs: in CI (`.ci/run` sets PPLEX_TRIO_CI) a test skipped for want of one of
# them is a failure, so a broken install can never pass as a green run with the oracle tests silently gone.
INSTALLED_BY_SETUP = (
    "'moshi",
    "'openai",
    "'pipecat",
    "'livekit",
    "chromium",
    "libopus",
    "promtool",
    "'telnyx",
    "'plivo",
)


def _fail_if_setup_should_have_installed_it(report: pytest.CollectReport | pytest.TestReport) -> None:
    if report.skipped and os.environ.get("PPLEX_TRIO_CI"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if any(name in reason for name in INSTALLED_BY_SETUP):
            report.outcome = "failed"
            report.longrepr = f"skipped in CI, where .ci/setup --test installs what it needs: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # a skip inside a test
    outcome = yield
    _fail_if_setup_should_have_installed_it(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # a module's importorskip
    outcome = yield
    _fail_if_setup_should_have_installed_it(outcome.get_result())
