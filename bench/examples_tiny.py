#!/usr/bin/env python3
"""bench/examples_tiny: the examples in examples/ against ``serve --model tiny``, with what the CPU left of real time.

Usage (from the repository root)::

    python bench/examples_tiny.py                           # the four examples, one after another
    python bench/examples_tiny.py --only pipecat-live --json bench/results/examples-tiny.json

Each example is run as a user runs it, on 2 s of real speech
(``../shared/data/speech_assistant.wav``, 3.3-5.3 s), against its own fresh
``pplex-trio serve --model tiny --slots 1`` (random weights: the answer is
noise). The examples stream at real-time pace and the tiny model's ticks run
on this CPU, so how much of the answer exists depends on whether the machine
kept up: per example it prints the seconds of audio written (the question plus
the example's tail is what a machine that keeps up gives), its loudest sample
(silence would be a fault), the ticks the server skipped for falling behind,
and the server's CPU seconds. The protocol itself is tested on the echo engine
(tests/compat/test_live_examples.py, tests/server/test_examples.py), which no
busy machine can starve.

Exit status 1 when an example fails or writes silence.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import wave

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from _serverproc import ServerProcess  # noqa: E402

SPEECH = REPO.parent / "shared" / "data" / "speech_assistant.wav"
EXAMPLES = {  # name: (script, extra arguments, what a machine that keeps up writes, in seconds)
    "openai-sdk": ("openai_sdk.py", (), 4.0),
    "telephony-bridge": ("telephony_bridge.py", (), 4.0),
    "pipecat-live": ("pipecat_live_agent.py", ("--voice", "{voice}"), 3.5),
    "livekit-live": ("livekit_live_agent.py", ("--voice", "{voice}"), 3.5),
}


def question(folder: pathlib.Path) -> pathlib.Path:
    with wave.open(str(SPEECH)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    path = folder / "question.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm[int(3.3 * rate) : int(5.3 * rate)].tobytes())
    return path


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(m[1]) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def run_one(name: str, folder: pathlib.Path) -> dict:
    script, extra, expected = EXAMPLES[name]
    server = ServerProcess(
        ["-m", "pplex_trio", "serve", "--port", "0", "--model", "tiny", "--slots", "1"],
        ready_pattern=r"Running on (http://127\.0\.0\.1:\d+)",
    )
    try:
        voices = json.loads(urllib.request.urlopen(server.address + "/api/voices", timeout=10).read())["voices"]
        answer = folder / f"{name}.wav"
        start = time.perf_counter()
        run = subprocess.run(
            [
                sys.executable,
                str(REPO / "examples" / script),
                str(question(folder)),
                str(answer),
                "--url",
                server.address,
                *(a.format(voice=voices[0]) for a in extra),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        wall = time.perf_counter() - start
        skipped = metric(server.address, "pplex_ticks_skipped_total")
        cpu = server.tree_cpu_seconds()
    finally:
        server.stop()
    result = {
        "example": name,
        "returncode": run.returncode,
        "wall_s": round(wall, 1),
        "expected_s": expected,
        "ticks_skipped": skipped,
        "server_cpu_s": round(cpu, 1),
        "audio_s": 0.0,
        "peak": 0.0,
    }
    if run.returncode != 0:
        result["error"] = (run.stdout + run.stderr)[-2000:]
    elif answer.exists():
        with wave.open(str(answer)) as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
            result["audio_s"] = round(pcm.size / w.getframerate(), 2)
        result["peak"] = round(float(np.abs(pcm).max(initial=0)) / 32768, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=list(EXAMPLES), help="this example (repeatable)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures here")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.only or EXAMPLES:
            results.append(run_one(name, pathlib.Path(folder)))
    print(
        f"{'example':<18}{'exit':>5}{'audio s':>9}{'keeps up':>9}{'peak':>7}{'skipped':>9}{'server CPU s':>14}"
        f"{'wall s':>8}"
    )
    for r in results:
        print(
            f"{r['example']:<18}{r['returncode']:>5}{r['audio_s']:>9.2f}{r['expected_s']:>9.1f}{r['peak']:>7.3f}"
            f"{r['ticks_skipped']:>9g}{r['server_cpu_s']:>14.1f}{r['wall_s']:>8.1f}"
        )
    for r in results:
        if "error" in r:
            print(f"\n{r['example']} failed:\n{r['error']}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if any(r["returncode"] != 0 or r["peak"] == 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
