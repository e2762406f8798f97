"""WebRTC calls against a real server on loopback: the real network (UDP, ICE, DTLS) is the point here.

The server runs on its own Trio thread (``ThreadServer``); each test's caller is aiortc on asyncio, on a thread of
its own (``run_asyncio``), as a Python app would call. The echo engine answers: what the caller says comes back.
"""

from __future__ import annotations

import pathlib
import wave
from collections.abc import Iterator

import numpy as np
import pytest
import soxr

pytest.importorskip("aiortc")

from _helpers.browser import ThreadServer  # noqa: E402
from _helpers.logs import captured_problems  # noqa: E402
from pplex_trio.engine import EchoEngine  # noqa: E402
from pplex_trio.server import ServerSettings  # noqa: E402

RATE = 48_000


@pytest.fixture(scope="module")
def echo_server() -> Iterator[ThreadServer]:
    """The echo engine (four slots) on a loopback port."""
    running = ThreadServer(ServerSettings(host="127.0.0.1", port=0, slots=4, model="echo"), EchoEngine(4)).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def problems() -> Iterator[list[str]]:
    """What ``pplex_trio`` logs at WARNING and up during the test (but a late tick: ``LATE_TICK``)."""
    with captured_problems() as seen:
        yield seen


@pytest.fixture(scope="session")
def speech(shared_dir: pathlib.Path) -> np.ndarray:
    """Two seconds of real speech (``speech_assistant.wav`` from 3.2 s), at 48 kHz, as a microphone gives it."""
    with wave.open(str(shared_dir / "data" / "speech_assistant.wav")) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    clip = pcm[int(3.2 * rate) : int(5.2 * rate)]
    return soxr.resample(clip, rate, RATE).astype(np.float32)
