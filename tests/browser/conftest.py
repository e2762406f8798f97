"""Fixtures of the real-browser tests: one Chromium with a fake microphone, servers on threads."""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from _helpers.browser import CHROMIUM, CHROMIUM_ARGS, ThreadServer, write_tone
from _helpers.rtc_page import write_speech
from pplex_trio._cli._engines import create_engine
from pplex_trio.engine import Engine
from pplex_trio.server import ServerSettings


@pytest.fixture(scope="session")
def playwright() -> Iterator[Any]:
    """Playwright's driver, one for the session (a second one in the same process is refused)."""
    if not CHROMIUM.exists():
        pytest.skip(f"browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        yield driver


def _chromium(playwright: Any, write_microphone: Any) -> Iterator[Any]:
    """A headless Chromium whose fake microphone plays the file ``write_microphone(path)`` writes."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="pplex-browser-"))
    microphone = folder / "microphone.wav"
    write_microphone(microphone)
    chromium = playwright.chromium.launch(
        executable_path=str(CHROMIUM),
        headless=True,
        args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={microphone}"],
    )
    yield chromium
    chromium.close()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def browser(playwright: Any) -> Iterator[Any]:
    """Chromium with a steady tone for a microphone."""
    yield from _chromium(playwright, write_tone)


@pytest.fixture(scope="session")
def speaking_browser(playwright: Any, shared_dir: pathlib.Path) -> Iterator[Any]:
    """A second Chromium whose fake microphone speaks (a few seconds of speech, looped): an echo of a tone is
    found at any whole number of its periods, an echo of speech at one lag only."""
    yield from _chromium(playwright, lambda path: write_speech(shared_dir, path))


def _profile(browser: Any, **options: Any) -> Iterator[Any]:
    """A fresh browser profile for one test; page errors fail the test."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, **options)
    ctx.set_default_timeout(15_000)
    errors: list[str] = []
    ctx.on("weberror", lambda e: errors.append(str(e.error)))
    yield ctx
    ctx.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    yield from _profile(browser, accept_downloads=True)


@pytest.fixture
def speaking_context(speaking_browser: Any) -> Iterator[Any]:
    """A fresh profile of the speaking Chromium."""
    yield from _profile(speaking_browser, accept_downloads=True)


@pytest.fixture
def tls_context(browser: Any) -> Iterator[Any]:
    """Like ``context``, but the profile accepts the test servers' self-signed certificates."""
    yield from _profile(browser, ignore_https_errors=True)


@pytest.fixture
def start_server(tmp_path: pathlib.Path) -> Iterator[Any]:
    """``start_server(engine=None, **settings)`` → a running :class:`ThreadServer` (by default the engine
    ``pplex-trio serve`` makes of the settings: the echo test engine; its voice store in the test's own folder)."""
    servers: list[ThreadServer] = []

    def start(engine: Engine | None = None, **overrides: Any) -> ThreadServer:
        options = dict(
            host="127.0.0.1", port=0, model="echo:delay=1,prompt=4", slots=2, voice_store=tmp_path / "voice-store"
        )
        options.update(overrides)
        settings = ServerSettings(**options)
        if engine is None:
            engine = create_engine(settings)  # as `pplex-trio serve` makes it
        server = ThreadServer(settings, engine).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
