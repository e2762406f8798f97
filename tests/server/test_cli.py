"""The command line: `pplex-trio serve` and `pplex-trio client`, as a user runs them."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import sphn

from _helpers.audio import best_lag

SR = 24_000
FRAME = 1920


@pytest.fixture
def server_process():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pplex_trio", "serve", "--model", "echo", "--slots", "4", "--port", "0"],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    for line in proc.stderr:
        match = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
        if match:
            break
    else:
        pytest.fail("server did not start")
    yield match.group(1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0
    proc.stderr.close()


def run_client(url, wav, out, text, protocol):
    return subprocess.Popen(
        [sys.executable, "-m", "pplex_trio", "client", url, "--input", str(wav), "--output", str(out),
         "--text", str(text), "--protocol", protocol, "--persona", "A test.", "--voice", "NATF1.pt"],
        stderr=subprocess.PIPE, text=True,
    )


def test_client_round_trips_a_wav_file_with_both_protocols(server_process, golden_dir, tmp_path):
    wav = golden_dir / "input.wav"  # 8 s of real speech
    sent, _ = sphn.read(str(wav))
    sent = sent[0]
    procs = {p: run_client(server_process, wav, tmp_path / f"{p}.wav", tmp_path / f"{p}.json", p) for p in ("moshi", "raw")}
    for protocol, proc in procs.items():
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    for protocol in procs:
        out, sr = sphn.read(str(tmp_path / f"{protocol}.wav"))
        out = out[0]
        assert sr == SR and out.size == sent.size  # as long as the input
        texts = json.loads((tmp_path / f"{protocol}.json").read_text())
        pieces = [t["text"] for t in texts]
        assert pieces[: len(pieces)] == [f" {i}" for i in range(len(pieces))]
        assert len(pieces) >= sent.size // FRAME - 2
        # The echo is the input, some frames late (16-bit wav rounding aside).  A
        # tick whose input came late carries silence and shifts the rest by a
        # frame, so compare one-second windows, each at its own lag.
        threshold = 0.999 if protocol == "raw" else 0.8  # raw is exact; Moshi has two Opus passes
        window = 24_000
        starts = [i for i in range(0, sent.size - window - 6 * FRAME, window) if sent[i : i + window].std() > 1e-3]
        scores = [best_lag(sent[i : i + window], out[i : i + window + 6 * FRAME], FRAME, 6 * FRAME)[1]
                  for i in starts]
        assert len(scores) >= 4
        good = sum(score > threshold for score in scores)
        assert good >= 0.75 * len(scores), (protocol, [round(x, 3) for x in scores])


def test_unknown_model_fails_with_a_clear_message():
    proc = subprocess.run(
        [sys.executable, "-m", "pplex_trio", "serve", "--model", "/nonexistent/checkpoint", "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "nonexistent" in proc.stderr


def test_client_reports_a_refused_conversation(server_process, golden_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pplex_trio", "client", server_process, "--input", str(golden_dir / "input.wav"),
         "--output", str(tmp_path / "o.wav"), "--voice", "../secret.pt"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 1
    assert "bare file name" in proc.stderr


def test_input_grace_flag_is_checked_and_reaches_the_engine_actor(capsys):
    from pplex_trio._cli import build_parser
    from pplex_trio.engine import EchoEngine
    from pplex_trio.server import ServerSettings
    from pplex_trio.server._state import ServerState

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--input-grace-ms", "50"])
    assert "too long for an 80 ms tick" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--input-grace-ms", "soon"])
    assert "'soon' is not a number of milliseconds" in capsys.readouterr().err
    assert build_parser().parse_args(["serve", "--input-grace-ms", "0"]).input_grace_ms == 0
    state = ServerState.create(ServerSettings(input_grace=0.002), EchoEngine(1))
    assert state.actor.input_grace == 0.002
