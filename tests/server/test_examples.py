"""The examples in examples/ run as a user runs them: the SDK one against `serve --model tiny`, and
the telephony bridge against the echo, whose reply must be the caller's audio back through μ-law."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import wave

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
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args, "--url", url], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_sdk_example_against_the_tiny_model(tmp_path):
    t = np.arange(24_000 * 2) / 24_000
    write_wav(tmp_path / "question.wav", (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 24_000)
    with server_process("--model", "tiny", "--slots", "1") as url:
        out = run_example("openai_sdk.py", url, str(tmp_path / "question.wav"), str(tmp_path / "answer.wav"))
    answer, rate = read_wav(tmp_path / "answer.wav")
    assert rate == 24_000 and answer.size >= 24_000 * 3  # the question (2 s) and the tail (2 s), less the start
    assert "transcript" in out


def test_the_telephony_bridge_against_the_tiny_model(tmp_path):
    t = np.arange(8_000 * 2) / 8_000
    write_wav(tmp_path / "caller.wav", (0.3 * np.sin(2 * np.pi * 400 * t)).astype(np.float32), 8_000)
    with server_process("--model", "tiny", "--slots", "1") as url:
        out = run_example("telephony_bridge.py", url, str(tmp_path / "caller.wav"), str(tmp_path / "reply.wav"))
    reply, rate = read_wav(tmp_path / "reply.wav")
    assert rate == 8_000 and reply.size >= 8_000 * 2 and "of the reply at 8 kHz" in out


def test_the_telephony_bridge_returns_the_caller_through_mu_law(tmp_path):
    t = np.arange(16_000 * 2) / 16_000  # a 16 kHz file: the bridge brings it to the phone's 8 kHz
    caller = (0.3 * np.sin(2 * np.pi * 500 * t)).astype(np.float32)
    write_wav(tmp_path / "caller.wav", caller, 16_000)
    with server_process("--model", "echo:prompt=2") as url:
        run_example("telephony_bridge.py", url, str(tmp_path / "caller.wav"), str(tmp_path / "reply.wav"))
    reply, rate = read_wav(tmp_path / "reply.wav")
    assert rate == 8_000 and reply.size >= 8_000 * 3
    spectrum = np.abs(np.fft.rfft(reply[8_000:16_000] * np.hanning(8_000)))
    assert abs(np.argmax(spectrum) * 8_000 / 8_000 - 500) <= 2  # the caller's 500 Hz came back
