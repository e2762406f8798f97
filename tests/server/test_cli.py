"""The command line: `pplex-trio serve` and `pplex-trio client`, as a user runs them."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import sphn

from _helpers.audio import best_window

SR = 24_000
FRAME = 1920


@pytest.fixture
def server_process():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pplex_trio", "serve", "--model", "echo", "--slots", "4", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
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
        [
            sys.executable,
            "-m",
            "pplex_trio",
            "client",
            url,
            "--input",
            str(wav),
            "--output",
            str(out),
            "--text",
            str(text),
            "--protocol",
            protocol,
            "--persona",
            "A test.",
            "--voice",
            "NATF1.pt",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )


def voiced_frames(pcm):
    """The frames (1920 samples from the start) that are not silence."""
    return [i for i in range(pcm.size // FRAME) if pcm[i * FRAME : (i + 1) * FRAME].std() > 1e-3]


def test_client_round_trips_a_wav_file_with_every_protocol(server_process, golden_dir, tmp_path):
    wav = golden_dir / "input.wav"  # 8 s of real speech
    sent, _ = sphn.read(str(wav))
    sent = sent[0]
    assert len(voiced_frames(sent)) > 50
    procs = {
        p: run_client(server_process, wav, tmp_path / f"{p}.wav", tmp_path / f"{p}.json", p)
        for p in ("moshi", "raw", "realtime")
    }
    for proc in procs.values():
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
        # Each frame the echo sends is a frame of what it was given, later.  How much later changes with load
        # (a tick whose input came late carries silence, a frame a slow reader could not take is dropped), so
        # every voiced output frame is found in the input on its own, wherever it is: the check is the same
        # on an idle machine and a loaded one.
        voiced = voiced_frames(out)
        assert len(voiced) >= len(voiced_frames(sent)) // 2, protocol  # most of it came back
        got = [out[i * FRAME : (i + 1) * FRAME] for i in voiced]
        matches = [best_window(frame, sent) for frame in got]
        want = [sent[offset : offset + FRAME] for offset, _ in matches]
        in_order = [offset for offset, similarity in matches if similarity > 0.9]
        assert in_order == sorted(in_order) and len(set(in_order)) == len(in_order), protocol  # none twice
        if protocol == "moshi":  # two lossy Opus passes, so the frames beside their matches as one signal
            assert np.corrcoef(np.concatenate(got), np.concatenate(want))[0, 1] > 0.9
        else:  # raw float32 and 16-bit PCM are exact, but for the 16-bit wav files at both ends
            assert all(np.abs(a - b).max() <= 2 / 32768 for a, b in zip(got, want)), protocol


def test_unknown_model_fails_with_a_clear_message():
    proc = subprocess.run(
        [sys.executable, "-m", "pplex_trio", "serve", "--model", "/nonexistent/checkpoint", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "nonexistent" in proc.stderr


def test_the_echo_engine_takes_its_options_in_the_model_name():
    from pplex_trio._cli._engines import create_engine
    from pplex_trio.server import ServerSettings

    engine = create_engine(ServerSettings(model="echo:delay=3, prompt=5,step_ms=40,text_share=0.25", slots=2))
    assert (engine.num_slots, engine.delay_frames, engine.prefill_steps, engine.text_share) == (2, 3, 5, 0.25)
    assert engine.step_seconds == pytest.approx(0.040) and engine.prefill_seconds == pytest.approx(0.040 / 50)
    plain = create_engine(ServerSettings(model="echo", slots=1))  # the defaults the README gives
    assert (plain.delay_frames, plain.prefill_steps, plain.step_seconds, plain.text_share) == (1, 12, 0.0, 1.0)


@pytest.mark.parametrize(
    "model,problem",
    [
        ("echo:dealy=2", "unknown option 'dealy'"),
        ("echo:delay", "delay needs a value, as in delay=1"),
        ("echo:delay=soon", "delay must be a whole number, not 'soon'"),
        ("echo:prompt=2.5", "prompt must be a whole number, not '2.5'"),
        ("echo:step_ms=-5", "step_ms must be at least 0, got -5"),
        ("echo:step_ms=inf", "step_ms must be finite, got inf"),
        ("echo:text_share=1.5", "text_share must be between 0 and 1, got 1.5"),
        ("echo:delay=1,delay=2", "delay is given twice"),
        ("echo:delay=1,", "an empty option"),
    ],
)
def test_a_bad_echo_option_stops_the_server_with_one_line(model, problem):
    proc = subprocess.run(
        [sys.executable, "-m", "pplex_trio", "serve", "--model", model, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert f"--model {model}: {problem} " in line
    assert line.endswith("(the echo engine's options and their defaults: delay=1, prompt=12, step_ms=0, text_share=1)")


def test_the_model_flag_names_every_echo_option_with_its_default():
    import dataclasses

    from pplex_trio._cli._engines import EchoOptions
    from pplex_trio.server import ServerSettings

    (model,) = [f for f in dataclasses.fields(ServerSettings) if f.name == "model"]
    options = ",".join(f"{f.name}={f.default:g}" for f in dataclasses.fields(EchoOptions))
    assert options == "delay=1,prompt=12,step_ms=0,text_share=1"
    assert model.metadata["help"].startswith(f"echo or echo:{options} (the test engine)")


def test_client_reports_a_refused_conversation(server_process, golden_dir, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pplex_trio",
            "client",
            server_process,
            "--input",
            str(golden_dir / "input.wav"),
            "--output",
            str(tmp_path / "o.wav"),
            "--voice",
            "../secret.pt",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert "bare file name" in proc.stderr


def test_input_grace_flag_is_checked_and_reaches_the_engine_actor(capsys):
    from pplex_trio._cli import build_parser
    from pplex_trio._cli._settings_cli import settings_from_args
    from pplex_trio.engine import EchoEngine
    from pplex_trio.server import ServerContext, ServerSettings

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--input-grace-ms", "50"])
    assert "--input-grace-ms: must be between 0 and 40, got 50" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--input-grace-ms", "soon"])
    assert "'soon' is not a number" in capsys.readouterr().err
    args = build_parser().parse_args(["serve", "--input-grace-ms", "2.5", "--queue-size", "3"])
    state = ServerContext.create(settings_from_args(ServerSettings, args), EchoEngine(1))
    assert state.actor.schedule.input_grace == 0.0025  # parsed, then through the settings into the actor
    assert state.actor.table.queue_size == 3


def test_every_setting_is_a_flag_with_the_dataclass_default():
    """The command line is generated from the settings: no default is written twice."""
    import dataclasses

    from pplex_trio._cli import build_parser
    from pplex_trio._cli._settings_cli import settings_from_args
    from pplex_trio.server import ServerSettings

    assert settings_from_args(ServerSettings, build_parser().parse_args(["serve"])) == ServerSettings()
    flags = {
        f.name: f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        for f in dataclasses.fields(ServerSettings)
        if f.metadata["cli"]
    }
    assert {"--input-grace-ms", "--static", "--opus-encoder", "--framing", "--inline-encoders"} <= set(flags.values())
    args = build_parser().parse_args(
        [
            "serve",
            "--framing",
            "naive",
            "--opus-encoder",
            "inline",
            "--cuda-graph",
            "--static",
            "/srv/ui",
            "--inline-encoders",
            "7",
        ]
    )
    settings = settings_from_args(ServerSettings, args)
    assert (settings.framing, settings.opus_encoder, settings.cuda_graph) == ("naive", "inline", "on")
    assert str(settings.static_dir) == "/srv/ui" and settings.inline_encoders == 7


@pytest.mark.parametrize(
    "flags, mode, argument",
    [
        ([], "auto", None),
        (["--cuda-graph"], "on", True),
        (["--no-cuda-graph"], "off", False),
        (["--cuda-graph", "auto"], "auto", None),
        (["--cuda-graph", "off"], "off", False),
        (["--cuda-graph=on", "--port", "1"], "on", True),
    ],
)
def test_cuda_graphs_are_auto_by_default_and_either_flag_still_forces_them(flags, mode, argument):
    from pplex_trio._cli import build_parser
    from pplex_trio._cli._settings_cli import settings_from_args
    from pplex_trio.server import ServerSettings

    settings = settings_from_args(ServerSettings, build_parser().parse_args(["serve", *flags]))
    assert settings.cuda_graph == mode and settings.cuda_graph.engine_argument is argument


def test_a_config_file_may_give_cuda_graph_as_a_switch_or_a_choice(tmp_path):
    from pplex_trio._cli._settings_cli import load_config
    from pplex_trio.server import ServerSettings

    for text, mode in (("true", "on"), ("false", "off"), ('"auto"', "auto"), ('"on"', "on")):
        (tmp_path / "c.toml").write_text(f"cuda-graph = {text}\n")
        assert ServerSettings(**load_config(tmp_path / "c.toml", ServerSettings)).cuda_graph == mode
    (tmp_path / "c.toml").write_text('cuda-graph = "sometimes"\n')
    with pytest.raises(ValueError, match="cuda-graph: expected one of auto, on, off"):
        load_config(tmp_path / "c.toml", ServerSettings)


def test_a_choice_outside_its_enum_is_refused_with_the_choices(capsys):
    from pplex_trio._cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--opus-encoder", "thread"])
    err = capsys.readouterr().err
    assert "'thread' is not one of auto, process, inline, sphn" in err


def test_settings_built_in_code_are_checked_too():
    from pplex_trio.server import ServerSettings

    with pytest.raises(ValueError, match="--slots must be at least 1, got 0"):
        ServerSettings(slots=0)
    with pytest.raises(ValueError):
        ServerSettings(framing="sideways")


def test_the_readme_lists_every_serve_flag():
    import dataclasses
    import pathlib

    from pplex_trio._setting import flag_of
    from pplex_trio.server import ServerSettings

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("## `pplex-trio serve`") : readme.index("## How it works")]
    missing = [
        flag_of(f) for f in dataclasses.fields(ServerSettings) if f.metadata["cli"] and f"`{flag_of(f)}`" not in table
    ]
    assert not missing, f"README's flag table lacks {missing}"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--port", "80000"], "--port: must be between 0 and 65535, got 80000"),
        (["--port", "eighty"], "--port: 'eighty' is not a whole number"),
        (["--host", "no-such-host.invalid"], "the host 'no-such-host.invalid' does not resolve"),
        (["--client-timeout", "0"], "--client-timeout: must be at least 0.1, got 0"),
    ],
)
def test_a_bad_command_line_gets_one_line_and_exit_status_2(args, words):
    proc = subprocess.run(
        [sys.executable, "-m", "pplex_trio", "serve", "--model", "echo", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert words in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 3


def test_a_port_in_use_is_named():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "pplex_trio", "serve", "--model", "echo", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr
