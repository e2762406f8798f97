"""The voice-agent examples run as a user runs them, against the echo: what they write is the question back.

``examples/pipecat_agent.py`` and ``examples/livekit_agent.py`` (both of its
plugins) each take a wav file for the microphone and write the model's answer
to a wav file. The three run at once (each is mostly waiting on real time), on
2 s of real speech; the echo engine's answer must hold that speech, and the
transcript each example logs must be the echo's frame numbers.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import wave
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("pipecat.services.openai.realtime.llm")
pytest.importorskip("livekit.plugins.openai")
pytest.importorskip("livekit.plugins.nvidia.experimental.realtime")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
RUNS = {
    "pipecat": ["pipecat_agent.py"],
    "livekit-openai": ["livekit_agent.py", "--plugin", "openai"],
    "livekit-personaplex": ["livekit_agent.py", "--plugin", "personaplex"],
}


@pytest.fixture(scope="module")
def examples(echo_server, caller, tmp_path_factory) -> Iterator[tuple[dict[str, subprocess.Popen], pathlib.Path]]:
    """All three examples started at once on the caller's first utterance; their output in a folder."""
    folder = tmp_path_factory.mktemp("examples")
    with wave.open(str(folder / "question.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24_000)
        w.writeframes((np.clip(caller.first, -1, 32767 / 32768) * 32768).astype("<i2").tobytes())
    processes = {}
    for name, (script, *options) in RUNS.items():
        with open(folder / f"{name}.log", "w") as log:  # a file, not a pipe: nothing blocks on a full pipe
            processes[name] = subprocess.Popen(
                [
                    sys.executable,
                    str(EXAMPLES / script),
                    str(folder / "question.wav"),
                    str(folder / f"{name}.wav"),
                    *options,
                    "--url",
                    echo_server.url,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    yield processes, folder
    for process in processes.values():
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.serial  # three agent processes talking at real time at once: beside the parallel suite they starve
@pytest.mark.parametrize("name", RUNS)
def test_the_example_answers_with_the_echo(examples, name, caller, assert_echoed):
    processes, folder = examples
    returncode = processes[name].wait(timeout=60)
    log = (folder / f"{name}.log").read_text()
    assert returncode == 0, log[-3000:]

    with wave.open(str(folder / f"{name}.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24_000)
        answer = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    assert answer.size >= 3 * 24_000  # the question (2 s) and most of the 2 s tail
    assert_echoed(caller.first, answer)

    (transcript,) = re.findall(r"transcript: '([^']*)'", log)
    numbers = [int(piece) for piece in transcript.split()]
    assert numbers == list(range(len(numbers))) and len(numbers) >= answer.size // 1920 - 2, transcript
