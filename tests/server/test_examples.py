"""The examples in examples/ run as a user runs them, against `serve --model echo`: the SDK one's answer and
the telephony bridge's reply must be the caller's audio back (the bridge's through μ-law), and the SDK one's
transcript the echo's frame numbers.  Against the tiny model: ``bench/examples_tiny.py``."""

from __future__ import annotations

import pathlib
import re
import socket
import struct
import subprocess
import sys
import threading
import wave

import httpx
import numpy as np
import pytest

from _helpers.official import server_process

pytest.importorskip("openai")
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def write_wav(path: pathlib.Path, pcm: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((pcm * 32767).astype("<i2").tobytes())


def read_wav(path: pathlib.Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768, w.getframerate()


def run_example(name: str, url: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args, "--url", url], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def echo_url():
    """One echo server for the module: the examples are tested for the protocol, which the echo checks exactly
    and no busy machine can starve (the tiny model's real-time run is ``bench/examples_tiny.py``)."""
    with server_process("--model", "echo:prompt=2", "--slots", "1") as url:
        yield url


def peak_hz(pcm: np.ndarray, rate: int) -> float:
    """The loudest frequency of the second second of ``pcm``."""
    spectrum = np.abs(np.fft.rfft(pcm[rate : 2 * rate] * np.hanning(rate)))
    return float(np.argmax(spectrum))  # a bin per hertz: one second at ``rate``


def test_the_sdk_example_returns_the_question_through_the_echo(echo_url, tmp_path):
    t = np.arange(24_000 * 2) / 24_000
    write_wav(tmp_path / "question.wav", (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 24_000)
    out = run_example("openai_sdk.py", echo_url, str(tmp_path / "question.wav"), str(tmp_path / "answer.wav"))
    answer, rate = read_wav(tmp_path / "answer.wav")
    assert rate == 24_000 and answer.size >= 24_000 * 3  # the question (2 s) and the tail (2 s), less the start
    assert abs(peak_hz(answer, rate) - 330) <= 2  # the question's 330 Hz came back
    (transcript,) = re.findall(r"transcript: '([^']*)'", out)  # the echo's frame numbers, in order
    numbers = [int(n) for n in transcript.split()]
    assert len(numbers) >= 30 and numbers == list(range(len(numbers))), transcript


def test_the_webrtc_example_returns_the_question_through_the_echo(echo_url, tmp_path):
    """OpenAI's WebRTC flow from Python (aiortc, the SDK's ``realtime.calls.create``): the question's tone comes
    back on the remote track, the echo's frame numbers on the data channel."""
    t = np.arange(24_000 * 2) / 24_000
    write_wav(tmp_path / "question.wav", (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 24_000)
    out = run_example("openai_sdk_webrtc.py", echo_url, str(tmp_path / "question.wav"), str(tmp_path / "a.wav"))
    answer, rate = read_wav(tmp_path / "a.wav")
    assert rate == 24_000 and answer.size >= 24_000 * 3.5
    assert abs(peak_hz(answer, rate) - 330) <= 2
    assert re.search(r"call: /v1/realtime/calls/rtc_[0-9a-f]{24}", out)
    (transcript,) = re.findall(r"transcript: '([^']*)'", out)
    numbers = [int(n) for n in transcript.split()]
    assert len(numbers) >= 30 and numbers == list(range(numbers[0], numbers[0] + len(numbers))), transcript


def test_the_telephony_bridge_returns_the_caller_through_mu_law(echo_url, tmp_path):
    t = np.arange(16_000 * 2) / 16_000  # a 16 kHz file: the bridge brings it to the phone's 8 kHz
    caller = (0.3 * np.sin(2 * np.pi * 500 * t)).astype(np.float32)
    write_wav(tmp_path / "caller.wav", caller, 16_000)
    out = run_example("telephony_bridge.py", echo_url, str(tmp_path / "caller.wav"), str(tmp_path / "reply.wav"))
    reply, rate = read_wav(tmp_path / "reply.wav")
    assert rate == 8_000 and reply.size >= 8_000 * 3 and "of the reply at 8 kHz" in out
    assert abs(peak_hz(reply, rate) - 500) <= 2  # the caller's 500 Hz came back


class ResettingRelay:
    """A TCP relay to ``port`` that resets its first connection, on both sides, ``after`` seconds (a network
    that drops a call); the connections after it are relayed as they are."""

    def __init__(self, port: int, after: float):
        self.port, self.after = port, after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port))
            self.connections += 1
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()
            if self.connections == 1:
                threading.Timer(self.after, self._reset, args=(client, server)).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    @staticmethod
    def _reset(*sockets: socket.socket) -> None:
        for sock in sockets:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_the_sdk_resume_example_survives_a_dropped_connection(tmp_path):
    t = np.arange(24_000 * 4) / 24_000
    write_wav(tmp_path / "question.wav", (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 24_000)
    with server_process("--model", "echo:prompt=2", "--slots", "1") as url:  # (its own: a slot it may hold)
        relay = ResettingRelay(int(url.rsplit(":", 1)[1]), after=2.0)
        try:
            out = run_example(
                "openai_sdk_resume.py", relay.url, str(tmp_path / "question.wav"), str(tmp_path / "answer.wav")
            )
        finally:
            relay.close()
        slots = httpx.get(url + "/health").json()["slots"]
        assert slots["held"] == 0  # it hung up (session.close): no slot held for a resume
    assert relay.connections == 2
    (resumed,) = re.findall(r"resumed session (\S+) \(was (\S+)\)", out)
    assert resumed[0] == resumed[1]  # the same session
    answer, rate = read_wav(tmp_path / "answer.wav")
    assert abs(peak_hz(answer, rate) - 330) <= 2  # the question's 330 Hz came back
    (transcript,) = re.findall(r"transcript: '([^']*)'", out)
    numbers = [int(n) for n in transcript.split()]
    # The echo's frame numbers go on across the drop (frames in flight lost), never from 0 again: the same row.
    assert numbers[0] == 0 and all(b > a for a, b in zip(numbers, numbers[1:])), transcript
    gaps = [b - a for a, b in zip(numbers, numbers[1:]) if b - a > 1]
    assert len(gaps) <= 1 and all(gap <= 20 for gap in gaps), transcript
