"""Browser-test helpers: the fake microphone, an in-process server, what a person does with the page.

Playwright's sync API throughout: browser tests are plain (not async) functions.
"""

from __future__ import annotations

import io
import pathlib
import threading
import time
import wave
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import trio
from playwright.sync_api import expect

from pplex_trio.engine import Engine
from pplex_trio.server import ServerSettings, serve

CHROMIUM = pathlib.Path("/usr/bin/chromium")

TONE_HZ = 873.0  # the fake microphone's tone: an odd number no frame size divides
TONE_RATE = 48_000
TONE_SECONDS = 4.0  # Chromium loops the file; whole periods keep the loop seamless enough

# The flags a headless Chromium needs on a machine with no network but loopback
# (see the machines guide), and a fake microphone.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]


def write_tone(path: pathlib.Path, hz: float = TONE_HZ, seconds: float = TONE_SECONDS) -> None:
    t = np.arange(int(TONE_RATE * seconds)) / TONE_RATE
    pcm = (0.3 * np.sin(2 * np.pi * hz * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(TONE_RATE)
        w.writeframes(pcm.tobytes())


class ThreadServer:
    """A real pplex-trio server on a loopback port, run by Trio on its own thread."""

    def __init__(self, settings: ServerSettings, engine: Engine):
        self.settings = settings
        self.engine = engine
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._http: httpx.Client | None = None
        self._thread = threading.Thread(target=self._run, name="pplex-test-server", daemon=True)

    def start(self) -> ThreadServer:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("test server did not start within 30 s")
        if self._error is not None:
            raise RuntimeError("test server failed to start") from self._error
        return self

    def _run(self) -> None:
        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self.handle = await nursery.start(serve, self.settings, self.engine)
                self._ready.set()

        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001 - reported by start() / stop()
            self._error = exc
            self._ready.set()

    @property
    def url(self) -> str:
        return self.handle.http_url

    def get(self, path: str) -> Any:
        return self._get(path).json()

    def get_text(self, path: str) -> str:
        return self._get(path).text

    def _get(self, path: str) -> httpx.Response:
        # One client for all requests: a new one per call costs an SSL context,
        # CPU time that the server's thread (sharing our GIL) would miss.
        if self._http is None:
            token = self.settings.auth_token
            self._http = httpx.Client(
                timeout=5,
                trust_env=False,
                verify=not self.settings.tls,
                headers={"authorization": f"Bearer {token}"} if token else None,
            )
        response = self._http.get(self.url + path)
        response.raise_for_status()
        return response

    def metric(self, name: str) -> float:
        """One unlabelled sample of /metrics."""
        assert self._http is not None or self.get("/health")
        for line in self._http.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(f"{name} not in /metrics")

    def stop(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._thread.is_alive():
            trio.from_thread.run(self.handle.shutdown, trio_token=self.token)
            self._thread.join(10)
        if self._error is not None:
            raise RuntimeError("test server crashed") from self._error


def wait_until(condition: Callable[[], Any], timeout: float, message: str) -> Any:
    """Poll `condition` until it returns something truthy; fail with `message` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{message} (waited {timeout} s)")
        time.sleep(0.2)


# -- the page ------------------------------------------------------------------------


def open_ui(context: Any, server: Any, query: str = "?transport=websocket") -> Any:
    """Open the web UI and wait until it has the server's voices; by default in its WebSocket mode (the Moshi
    protocol: what most browser tests are about; tests/browser/test_web_ui_webrtc.py has the WebRTC mode's)."""
    page = context.new_page()
    page.goto(server.url + "/" + query)
    expect(page.locator("#server-info")).to_contain_text("Model:")  # /api/info and /api/voices loaded
    expect(page.locator("#voice option").first).not_to_have_text("Loading voices…")
    return page


def phase(page: Any) -> Any:
    return page.locator("#state")


def wait_phase(page: Any, name: str, timeout: float = 15_000) -> None:
    expect(phase(page)).to_have_attribute("data-phase", name, timeout=timeout)


def stat(page: Any, name: str) -> float:
    """A stats value (played, missed, latency, buffer) in seconds, as the page shows it."""
    value = page.locator(f"#stat-{name}").get_attribute("data-value")
    return float(value) if value else float("nan")


def wait_stat_above(page: Any, name: str, value: float, timeout: float = 15_000) -> None:
    page.wait_for_function(
        "([id, v]) => Number(document.getElementById(id).dataset.value) > v",
        arg=[f"stat-{name}", value],
        timeout=timeout,
    )


def disable_voice_processing(page: Any) -> None:
    page.get_by_text("Advanced settings").click()
    page.get_by_label("Voice processing").uncheck()


def download_recording(page: Any) -> tuple[np.ndarray, int]:
    """Click "Download recording"; return the WAV as float (frames, 2) (model left, mic right) and its rate."""
    with page.expect_download() as info:
        page.get_by_role("button", name="Download recording").click()
    path = info.value.path()
    with wave.open(io.BytesIO(path.read_bytes())) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (2, 2)
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.reshape(-1, 2).astype(np.float64) / 32768.0, rate


def peak_frequency(signal: np.ndarray, rate: int) -> tuple[float, float]:
    """The strongest frequency (Hz, refined by parabolic interpolation) and its prominence in dB.

    Prominence: the peak's power over the median power of the spectrum.
    """
    windowed = signal * np.hanning(signal.size)
    size = 1 << int(np.ceil(np.log2(signal.size * 4)))  # zero-pad for a finer grid
    power = np.abs(np.fft.rfft(windowed, size)) ** 2
    k = int(np.argmax(power[1:-1])) + 1
    a, b, c = np.log(power[k - 1 : k + 2] + 1e-30)
    shift = 0.5 * (a - c) / (a - 2 * b + c)
    hz = (k + shift) * rate / size
    prominence = 10 * np.log10(power[k] / np.median(power))
    return float(hz), float(prominence)
