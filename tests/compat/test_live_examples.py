"""The Live-protocol voice-agent examples run as a user runs them, against the echo: what they write is the question
back.

``examples/pipecat_live_agent.py`` and ``examples/livekit_live_agent.py`` each
take a wav file for the microphone and write the model's answer to a wav file,
over ``/v1/live/sessions``. The two run at once (each is mostly waiting on real
time), on 2 s of real speech; the echo engine's answer must hold that speech,
the transcript each example logs must be the echo's frame numbers, and the
server must have ended each conversation as completed (the example hung up with
``session.close``), with nothing to complain of in its log.  Against the tiny
model, whose ticks a busy CPU cannot keep in real time: ``bench/examples_tiny.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import re
import subprocess
import sys
import wave
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("pipecat.services.openai.live.llm")
pytest.importorskip("livekit.plugins.openai.realtime")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
RUNS = {
    "pipecat-live": "pipecat_live_agent.py",
    "livekit-live": "livekit_live_agent.py",
}
RATE = 24_000
FRAME = RATE * 80 // 1000  # the model's frame: one transcript fragment each


@dataclasses.dataclass
class Runs:
    processes: dict[str, subprocess.Popen]
    folder: pathlib.Path  # the question, and each example's answer and log
    ended_before: collections.Counter[str]  # the server's Live conversations ended before they started
    log_mark: int  # and its log's length then


@pytest.fixture(scope="module")
def examples(echo_server, caller, tmp_path_factory) -> Iterator[Runs]:
    """Both examples started at once on the caller's first utterance."""
    folder = tmp_path_factory.mktemp("live-examples")
    with wave.open(str(folder / "question.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes((np.clip(caller.first, -1, 32767 / 32768) * 32768).astype("<i2").tobytes())
    before, mark = echo_server.ended("live"), len(echo_server.log)
    processes = {}
    for name, script in RUNS.items():
        with open(folder / f"{name}.log", "w") as log:  # a file, not a pipe: nothing blocks on a full pipe
            processes[name] = subprocess.Popen(
                [
                    sys.executable,
                    str(EXAMPLES / script),
                    str(folder / "question.wav"),
                    str(folder / f"{name}.wav"),
                    "--url",
                    echo_server.url,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    yield Runs(processes, folder, before, mark)
    for process in processes.values():
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("name", RUNS)
def test_the_live_example_answers_with_the_echo(examples, name, caller, assert_echoed):
    returncode = examples.processes[name].wait(timeout=60)
    log = (examples.folder / f"{name}.log").read_text()
    assert returncode == 0, log[-3000:]
    assert "model error" not in log and "Session startup failed" not in log, log[-3000:]

    with wave.open(str(examples.folder / f"{name}.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        answer = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    # The question (2 s) and its 2 s tail, on the call's timeline: the echo's delay and the hang-up may add a
    # little, and Pipecat's last frames may not come back before it hangs up.
    assert 3.5 * RATE <= answer.size <= 5 * RATE, answer.size / RATE
    pieces = assert_echoed(caller.first, answer)
    assert pieces[0].at < 0.5, pieces  # at once, not after a wait

    # The transcript: the echo's frame numbers, from the first, at least through the echo of the question.
    (transcript,) = re.findall(r"transcript: '([^']*)'", log)
    numbers = [int(piece) for piece in transcript.split()]
    assert numbers == list(range(len(numbers))), transcript
    assert len(numbers) >= (pieces[-1].at * RATE + RATE // 2) // FRAME, transcript


def test_the_server_saw_both_calls_end_cleanly(examples, echo_server):
    """Each example hung up with session.close: the server ended both conversations as completed, and had nothing
    to complain of in its log."""
    for process in examples.processes.values():
        process.wait(timeout=60)
    echo_server.wait_closed("live", examples.ended_before, count=len(RUNS), outcome="completed")
    assert echo_server.problems_since(examples.log_mark) == []
