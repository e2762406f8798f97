"""Fixtures of the compatibility tests: third-party voice-agent clients against a real echo server.

One ``pplex-trio serve --model echo`` child process serves the whole folder. The
echo engine returns the caller's audio one 80 ms frame later and, as text, the
frame numbers " 0", " 1", ..., so each test can check what came back against
what it sent, whatever the client did to the audio on the way (resampling,
Opus, chunking). The caller's words come from ``hearing_server``, an echo with a
scripted transcriber run in the test's process (the command line's echo
transcribes nothing).

The clients are asyncio libraries: their tests are plain functions that run
their own event loop on a thread of its own (``_helpers.aio.run_asyncio``), beside the
Trio of the test suite and whatever loop an earlier test left running on the
main thread (Playwright's sync API keeps one there).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import pathlib
import re
import time
import wave
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
import soxr

from _helpers.audio import best_lag
from _helpers.logs import LATE_TICK, captured_problems
from _helpers.official import server_process
from pplex_trio.engine import EchoEngine

logger = logging.getLogger(__name__)

RATE = 24_000  # the model's rate, and the rate every client hands its output back at

_ENDED = re.compile(r"^pplex_sessions_ended_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


class EchoServer:
    """The echo server, and what the tests ask of it over HTTP."""

    def __init__(self, url: str, log: list[str]):
        self.url = url  # http://127.0.0.1:PORT
        self.ws_url = url.replace("http", "ws", 1)
        self.log = log  # its stderr, line by line, as it comes
        self._http = httpx.Client(timeout=5, trust_env=False)

    def get(self, path: str) -> dict:
        response = self._http.get(self.url + path)
        response.raise_for_status()
        return response.json()

    def ended(self, protocol: str) -> collections.Counter[str]:
        """Conversations of ``protocol`` ended so far, by outcome (``client_closed``, ``protocol_error``, ...)."""
        counts: collections.Counter[str] = collections.Counter()
        for line in self._http.get(self.url + "/metrics").text.splitlines():
            if match := _ENDED.match(line):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
                if labels["protocol"] == protocol:
                    counts[labels["outcome"]] += int(float(match["value"]))
        return counts

    def wait_closed(
        self,
        protocol: str,
        before: collections.Counter[str],
        count: int = 1,
        within: float = 1.0,
        outcome: str = "client_closed",
    ) -> None:
        """``count`` conversation(s) of ``protocol`` ended since ``before``, as closed by the client, within
        ``within`` s of now (the moment the client's close returned), and none is left open.

        The server counts a conversation as ended once its socket is closed and
        its slot freed, by outcome: a clean close is ``client_closed``, not a
        ``client_timeout`` nor a ``protocol_error`` (or any other); a Live
        client's ``session.close`` is ``completed`` (its last words flushed,
        then ``session.closed``).
        """
        deadline = time.monotonic() + within
        while True:
            new = self.ended(protocol) - before
            if sum(new.values()) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert new == collections.Counter({outcome: count}), (
            f"within {within} s of the client closing, the server ended: {dict(new)} (want {count} {outcome})"
        )
        assert self.get("/api/sessions")["sessions"] == []

    def problems_since(self, mark: int) -> list[str]:
        """Warnings, errors and tracebacks the server logged since line ``mark`` of its log, but for the actor
        falling a tick behind: this server runs on the real clock beside the rest of the suite, and its ticks'
        timing is the benchmarks' to measure, not a framework's conversation's."""
        return [
            line
            for line in self.log[mark:]
            if re.search(r" (WARNING|ERROR|CRITICAL) |Traceback", line) and not LATE_TICK.search(line)
        ]

    def close(self) -> None:
        self._http.close()


@pytest.fixture(scope="session")
def echo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EchoServer]:
    log: list[str] = []
    store = tmp_path_factory.mktemp("voice-store")
    with server_process("--model", "echo", "--voice-store", str(store), lines=log) as url:
        server = EchoServer(url, log)
        yield server
        server.close()


# What the hearing echo "hears" the caller say, by the conversation's frame (80 ms each): the first utterance of
# ``caller`` runs over frames 0-24 of a client that speaks at once (its words come 0.5 s later, as a real
# transcriber's would). No end-of-turn head: the server's VAD ends the caller's turn.
HEARD = {8: " What's", 9: " the", 11: " weather?"}
HEARD_TEXT = "What's the weather?"


class HearingServer:
    """An in-process echo server that transcribes the caller (``HEARD``), with what it logged at WARNING and up."""

    def __init__(self, running, problems: list[str]):
        self.running = running
        self.url = running.url
        self.ws_url = self.url.replace("http", "ws", 1)
        self.problems = problems
        self.heard = list(HEARD.values())  # the pieces, as the transcriber gives them
        self.heard_text = HEARD_TEXT  # the caller's turn, whole


@pytest.fixture(scope="session")
def _hearing_running() -> Iterator[object]:
    """The echo engine with a scripted transcriber, on a real loopback socket (its Trio on a thread of its own).

    The command line's echo transcribes nothing (``--transcribe`` is for the real model and ``tiny``); its
    scripted transcript is for tests, so this server runs in the test's process.
    """
    from _helpers.browser import ThreadServer
    from pplex_trio.server import ServerSettings

    engine = EchoEngine(2, transcript=lambda frame, pcm: (HEARD.get(frame), None))
    running = ThreadServer(ServerSettings(host="127.0.0.1", port=0, slots=2), engine).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def hearing_server(_hearing_running) -> Iterator[HearingServer]:
    """The hearing server, with what ``pplex_trio`` logged at WARNING and up during this test only.

    The server lives for the session, but the capture is the test's: other tests in this process
    log on purpose (a compile check made to fail, say), and their lines are not this server's.
    """
    with captured_problems() as problems:
        yield HearingServer(_hearing_running, problems)


@dataclasses.dataclass(frozen=True)
class CallerLine:
    """What the caller says, at 24 kHz: an utterance, a pause, a second utterance, a pause.

    The second utterance is the barge-in: the caller speaks again while the
    model's audio is streaming (the echo never stops). The pause is long enough
    for the server's voice activity detector to end the first utterance (480 ms
    below its threshold), so the second one starts speech anew.
    """

    first: np.ndarray
    second: np.ndarray
    pause: float = 0.8  # seconds
    tail: float = 0.6

    @property
    def audio(self) -> np.ndarray:
        gap, tail = np.zeros(int(self.pause * RATE), np.float32), np.zeros(int(self.tail * RATE), np.float32)
        return np.concatenate([self.first, gap, self.second, tail])

    @property
    def second_starts(self) -> float:
        """When the barge-in starts, in seconds from the start of the line."""
        return self.first.size / RATE + self.pause

    def at(self, rate: int) -> np.ndarray:
        """The whole line at ``rate`` Hz (float32), as a client's audio source delivers it."""
        return self.audio if rate == RATE else soxr.resample(self.audio, RATE, rate).astype(np.float32)

    def chunks(self, rate: int, ms: int) -> list[bytes]:
        """The line at ``rate`` as PCM16 chunks of ``ms`` milliseconds (the last partial one dropped)."""
        pcm = pcm16(self.at(rate))
        size = rate * ms // 1000 * 2
        return [pcm[i : i + size] for i in range(0, len(pcm) - size + 1, size)]


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()


def from_pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768


@pytest.fixture(scope="session")
def caller(shared_dir: pathlib.Path) -> CallerLine:
    """Two stretches of real speech from ``speech_assistant.wav`` (24 kHz), 2 s each."""
    with wave.open(str(shared_dir / "data" / "speech_assistant.wav")) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (RATE, 1, 2)
        speech = from_pcm16(w.readframes(w.getnframes()))
    # The file's speech runs from 3.2 s to 8.0 s and from 21.5 s to 26 s (silence between); each stretch
    # starts and ends in speech (Opus turns the file's faint noise between them into digital silence).
    return CallerLine(
        first=speech[int(3.3 * RATE) : int(5.3 * RATE)], second=speech[int(21.7 * RATE) : int(23.7 * RATE)]
    )


PIECE = RATE // 2  # an utterance is looked for half a second at a time


@dataclasses.dataclass(frozen=True)
class Piece:
    """Where and how well half a second of the caller's speech came back."""

    at: float  # seconds into the audio that came back
    correlation: float
    bar: float  # the correlation it had to reach


def find_echo(
    utterance: np.ndarray, received: np.ndarray, codec: Callable[[np.ndarray], np.ndarray] | None = None
) -> list[Piece]:
    """Each half second of ``utterance`` (24 kHz) at its best lag in ``received`` (24 kHz).

    The bar is 0.9, or, for audio that went through a lossy ``codec`` on the
    way, what that codec alone leaves of the piece (applied here, locally) less
    0.05.
    """
    coded = codec(utterance) if codec is not None else None
    pieces = []
    for start in range(0, utterance.size - PIECE + 1, PIECE):
        piece = utterance[start : start + PIECE]
        assert received.size > piece.size, f"only {received.size / RATE:.2f} s of audio came back"
        lag, corr = best_lag(piece, received, 0, received.size - piece.size)
        bar = 0.9 if coded is None else min(0.9, best_lag(piece, coded, 0, coded.size - piece.size)[1] - 0.05)
        pieces.append(Piece(lag / RATE, corr, bar))
    return pieces


@pytest.fixture(scope="session")
def assert_echoed():
    """``assert_echoed(utterance, received, codec=None)``: the utterance came back in ``received``, in order.

    Half a second at a time, Pearson correlation at the best lag: the echo of
    real speech through PCM16 and resampling scores above 0.95, through Opus
    twice 0.8-0.96; a wrong lag, other speech or silence scores far below.
    One piece may miss its bar and the pieces may drift by up to two frames
    (160 ms) from one another: a tick that found no whole frame of the caller's
    audio waiting fed the model silence (the server's framing learns a client's
    jitter so), which delays the rest by a frame, and the framing may skip a
    little surplus input. A server that lost the caller's audio, reordered it
    or fell behind fails. Returns the pieces.
    """

    def check(
        utterance: np.ndarray, received: np.ndarray, codec: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> list[Piece]:
        pieces = find_echo(utterance, received, codec)
        report = ", ".join(f"{p.correlation:.3f}/{p.bar:.2f} at {p.at:.2f} s" for p in pieces)
        good = [(k, p) for k, p in enumerate(pieces) if p.correlation >= p.bar]
        assert len(good) >= len(pieces) - 1, f"the caller's speech did not come back: {report}"
        for (j, a), (k, b) in zip(good, good[1:]):
            assert abs(b.at - a.at - (k - j) * PIECE / RATE) <= 0.16, f"the echo is out of time: {report}"
        logger.info("echo: %s", report)
        return pieces

    return check


@pytest.fixture
def recording_http():
    """``recording_http()``, called in the client's event loop: an aiohttp session and the WebSockets it opens.

    The LiveKit plugins take an ``http_session``; the sockets it hands them are
    kept, with the address each was opened at (``socket.url``), so that a test
    can see how many connections a plugin made, where, and that they closed.
    """
    import aiohttp

    def make() -> tuple[aiohttp.ClientSession, list[aiohttp.ClientWebSocketResponse]]:
        sockets: list[aiohttp.ClientWebSocketResponse] = []
        urls: list[str] = []

        async def on_request_start(_session, _context, params: aiohttp.TraceRequestStartParams) -> None:
            urls.append(str(params.url))

        class RecordedSocket(aiohttp.ClientWebSocketResponse):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.url = urls[-1]
                sockets.append(self)

        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(on_request_start)
        return aiohttp.ClientSession(ws_response_class=RecordedSocket, trace_configs=[trace]), sockets

    return make
