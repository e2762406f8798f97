"""`pplex-trio serve`: a help a person can read, and the settings in a TOML file (--config)."""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
import re
import signal
import urllib.request

import pytest

from _helpers.process import start_serve
from pplex_trio._cli import build_parser, log_level
from pplex_trio._cli._settings_cli import cli_fields, is_advanced, settings_from_args, toml_key
from pplex_trio._setting import flag_of
from pplex_trio.server import ServerSettings

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "serve.example.toml"


def help_text(monkeypatch, capsys, option: str) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", option])
    assert exited.value.code == 0
    return capsys.readouterr().out


def parse(*args: str) -> ServerSettings:
    return settings_from_args(ServerSettings, build_parser().parse_args(["serve", *args]))


def test_help_fits_two_screens_and_leaves_the_test_and_tuning_knobs_to_help_all(monkeypatch, capsys):
    text = help_text(monkeypatch, capsys, "--help")
    lines = text.splitlines()
    assert len(lines) <= 100 and max(map(len, lines)) <= 80
    assert lines[0] == "usage: pplex-trio serve [options]"
    for common in (
        "--host",
        "--port",
        "--ssl",
        "--model",
        "--slots",
        "--device",
        "--auth-token",
        "--config",
        "--log-level",
        "--help-all",
    ):
        assert re.search(rf"^  {common}\b", text, flags=re.M), common
    for hidden in ("--framing", "--opus-encoder", "--input-grace-ms", "--input-backlog-seconds"):
        assert hidden not in text
    # The groups in the order a person looks for them.
    titles = [line[:-1] for line in lines if re.fullmatch(r"[a-z][a-zA-Z ]+:", line)]
    assert titles == ["options", "listening", "model and GPU", "conversations", "voices", "security", "observability"]


def test_help_all_lists_every_flag_and_says_defaults_as_one_would_type_them(monkeypatch, capsys):
    text = help_text(monkeypatch, capsys, "--help-all")
    missing = [flag_of(field) for field in cli_fields(ServerSettings) if flag_of(field) not in text]
    assert not missing
    assert "timing:" in text and "--echo" not in text  # the echo engine's options are the model name's
    flat = " ".join(text.split())
    assert "(default )" not in flat and "Framing." not in flat and "(default None)" not in flat
    assert "(default aligned)" in flat and "(default auto)" in flat and "(default 8998)" in flat
    assert "(default 60)" in flat  # --queue-timeout: 60, not 60.0


def test_advanced_means_tests_and_tuning():
    advanced = {flag_of(field) for field in cli_fields(ServerSettings) if is_advanced(field)}
    assert {
        "--framing",
        "--opus-encoder",
        "--inline-encoders",
        "--input-grace-ms",
        "--early-start-ms",
        "--input-backlog-seconds",
        "--output-backlog-seconds",
        "--first-frame-timeout",
    } <= advanced
    assert not advanced & {"--host", "--port", "--ssl", "--model", "--slots", "--drain-seconds"}
    groups = {field.metadata["group"] for field in cli_fields(ServerSettings)}
    assert groups <= set(ServerSettings.help_groups)


def test_log_level_before_or_after_the_sub_command_or_in_the_file(tmp_path):
    parser = build_parser()
    assert log_level(parser.parse_args(["serve"])) == "INFO"
    assert log_level(parser.parse_args(["serve", "--log-level", "debug"])) == "DEBUG"
    assert log_level(parser.parse_args(["--log-level", "WARNING", "serve"])) == "WARNING"
    assert log_level(parser.parse_args(["fit", "--log-level", "ERROR"])) == "ERROR"
    config = tmp_path / "serve.toml"
    config.write_text('log-level = "debug"\n')
    assert log_level(parser.parse_args(["serve", "--config", str(config)])) == "DEBUG"
    assert log_level(parser.parse_args(["serve", "--config", str(config), "--log-level", "ERROR"])) == "ERROR"


def toml_value(value) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, pathlib.Path):
        value = str(value)
    return json.dumps(value)  # true, 8998, 2.0 and "text" are TOML as well


# Fields whose default (None) TOML cannot write: a value each (as written, as read), to show their key works.
SAMPLES = {
    "slots": ("auto", None),
    "certfile": ("c.pem", pathlib.Path("c.pem")),
    "keyfile": ("k.pem", pathlib.Path("k.pem")),
    "voice_dir": ("v", pathlib.Path("v")),
    "voice_store": ("s", pathlib.Path("s")),
    "static_dir": ("ui", pathlib.Path("ui")),
    "record_dir": ("r", pathlib.Path("r")),
    "auth_token": ("t0ken", "t0ken"),
    "twilio_auth_token": ("tw1l1o", "tw1l1o"),
    "telnyx_public_key": (
        "+WGjuHv0XbhfVLCZEebb7l6ADv+UMXv2/0cVHqFbaHg=",
        "+WGjuHv0XbhfVLCZEebb7l6ADv+UMXv2/0cVHqFbaHg=",
    ),
    "plivo_auth_token": ("pl1v0", "pl1v0"),
    "webrtc_host": ("203.0.113.7", "203.0.113.7"),
    "webrtc_ports": ("40000-40999", "40000-40999"),
}


def test_every_flag_has_a_toml_key_that_round_trips(tmp_path):
    lines, expected = [], {}
    for field in cli_fields(ServerSettings):
        if field.name == "ssl_dir":
            continue  # either it or certfile and keyfile: below
        if field.default is None:
            written, expected[field.name] = SAMPLES[field.name]
            lines.append(f"{toml_key(field)} = {toml_value(written)}")
        else:
            lines.append(f"{toml_key(field)} = {toml_value(field.default)}")
    config = tmp_path / "all.toml"
    config.write_text("\n".join(lines) + "\n")
    settings = parse("--config", str(config))
    assert settings == dataclasses.replace(ServerSettings(), **expected)
    config.write_text('ssl = "tls"\n')
    assert parse("--config", str(config)).ssl_dir == pathlib.Path("tls")
    assert all(toml_key(field) == flag_of(field)[2:] for field in cli_fields(ServerSettings))


def test_the_command_line_overrides_the_file(tmp_path):
    config = tmp_path / "serve.toml"
    config.write_text(
        'port = 9000\nslots = 8\nclient-timeout = 20\nframing = "naive"\naccess-log = true\n'
        'gpu-memory-reserve = "1536MiB"\n'
    )
    settings = parse("--config", str(config), "--port", "9001", "--no-access-log")
    assert (settings.port, settings.slots, settings.client_timeout) == (9001, 8, 20.0)
    assert settings.framing == "naive" and settings.access_log is False and settings.gpu_memory_reserve_gib == 1.5
    assert parse("--port", "9001", "--config", str(config)).port == 9001  # wherever the flag is


@pytest.mark.parametrize(
    "text, words",
    [
        ("slot = 8\n", "unknown key 'slot' (did you mean 'slots'?)"),
        ("client_timeout = 20\n", "unknown key 'client_timeout' (did you mean 'client-timeout'?)"),
        ("[listening]\nport = 1\n", "unknown key 'listening'"),
        ('port = "8998"\n', 'port: expected a whole number, got "8998"'),
        ("port = 80000\n", "port: must be between 0 and 65535, got 80000"),
        ("client-timeout = true\n", "client-timeout: expected a number, got true"),
        ('access-log = "yes"\n', 'access-log: expected true or false, got "yes"'),
        ('framing = "wide"\n', 'framing: expected one of aligned, naive, got "wide"'),
        ("host = 1\n", "host: expected text in quotes, got 1"),
        ('slots = "many"\n', "slots: 'many' is neither a whole number nor auto"),
        ('log-level = "LOUD"\n', "log-level: expected one of DEBUG, INFO, WARNING, ERROR"),
        ("port = \n", "not valid TOML"),
    ],
)
def test_a_mistake_in_the_file_is_said_in_words(tmp_path, capsys, text, words):
    config = tmp_path / "serve.toml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--config", str(config)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{config}: {words}" in err and len(err.strip().splitlines()) == 1


def test_the_example_file_parses_with_its_commented_lines_too(tmp_path):
    settings = parse("--config", str(EXAMPLE))
    assert settings.refuse_busy_upgrades and settings.drain_seconds == 300 and settings.slots is None
    # Each commented "# key = value" line is a valid setting as well.
    text = EXAMPLE.read_text()
    uncommented = re.sub(r"^# (?=[a-z-]+ = )", "", text, flags=re.M)
    assert uncommented.count("\n# ") < text.count("\n# ") - 10
    everything = tmp_path / "everything.toml"
    everything.write_text(uncommented)
    # certfile with ssl is refused by the settings themselves (one or the other), not by the file.
    with pytest.raises(ValueError, match="either --ssl DIR or --certfile"):
        parse("--config", str(everything))


def test_serve_starts_from_the_example_file_with_flags_over_it(tmp_path):
    config = tmp_path / "serve.toml"  # the example, serving the test engine with 3 slots
    config.write_text(
        EXAMPLE.read_text().replace('model = "auto"', 'model = "echo"').replace('slots = "auto"', "slots = 3")
    )
    proc, port, _ = start_serve("--config", str(config), "--log-level", "DEBUG")  # and --port 0: over the file's
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as response:
            assert json.load(response)["slots_total"] == 3
    finally:
        proc.send_signal(signal.SIGINT)  # SIGINT does not wait for the file's drain-seconds
        assert proc.wait(timeout=20) == 0
        assert proc.stderr is not None
        proc.stderr.close()
