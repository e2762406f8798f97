"""bench/stack_floor.py: its floor servers speak enough of the Moshi protocol, and the run reports a figure."""

import importlib.util
import json
import pathlib
import sys

import pytest
import trio
import trio.testing

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("bench_stack_floor", ROOT / "bench" / "stack_floor.py")
floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(floor)


@pytest.mark.parametrize("variant,placement", [("ours", "auto"), ("ours-inline", "inline")])
def test_our_variants_are_servers_serve_starts_as_the_figures_say(variant, placement):
    """No run here starts our server (the short runs below start floor servers), so its command line is read
    by the parser that will read it: the echo engine standing in for a GPU at 20 ms a tick, text on 30 % of
    frames (as the floor servers' default), a slot per client and no queue."""
    from pplex_trio._cli import build_parser
    from pplex_trio._cli._engines import create_engine
    from pplex_trio._cli._settings_cli import settings_from_args
    from pplex_trio.server import ServerSettings

    command = floor.server_command(variant, 8)
    assert command[:3] == ["-m", "pplex_trio", "serve"]
    settings = settings_from_args(ServerSettings, build_parser().parse_args(command[2:]))
    assert (settings.slots, settings.queue_size, settings.opus_encoder) == (8, 0, placement)
    engine = create_engine(settings)
    assert (engine.step_seconds, engine.prefill_steps, engine.text_share) == (0.020, 12, 0.3)


@pytest.mark.serial  # timing-bound: a frame every 80 ms only holds on an unloaded machine
def test_a_short_run_of_two_floor_servers_measures_both(tmp_path, monkeypatch):
    monkeypatch.setattr(floor, "RESULTS", tmp_path)
    assert (
        floor.main(
            [
                "--clients",
                "2",
                "--duration",
                "1",
                "--warmup",
                "0.3",
                "--variants",
                "asgi",
                "quart+codecs0",
                "--name",
                "t",
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "t.json").read_text())["results"]
    assert [r["variant"] for r in rows] == ["asgi", "quart+codecs0"]
    # CPU is measured (a process's CPU time comes in 10 ms clock ticks: two conversations for a second on the bare
    # floor may use less than one, so 0 is a measurement too)
    assert all(r["cpu_ms_per_conv_s"] >= 0 for r in rows)
    # two conversations are nothing for either: each client got a frame every 80 ms (± one at the edges)
    assert all(11.5 <= r["audio_frames_per_s"] <= 13.5 for r in rows)


def test_rounds_interleave_the_servers_and_report_each_rounds_ratio(tmp_path, monkeypatch):
    monkeypatch.setattr(floor, "RESULTS", tmp_path)
    assert (
        floor.main(
            [
                "--clients",
                "2",
                "--duration",
                "1",
                "--warmup",
                "0.3",
                "--variants",
                "asgi+codecs0",
                "asgi",
                "--rounds",
                "2",
                "--name",
                "t",
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "t.json").read_text())["results"]
    assert [(r["variant"], r["round"]) for r in rows] == [
        ("asgi+codecs0", 0),
        ("asgi", 0),
        ("asgi+codecs0", 1),
        ("asgi", 1),
    ]
    ratios = [
        rows[1]["cpu_ms_per_conv_s"] / rows[0]["cpu_ms_per_conv_s"],
        rows[3]["cpu_ms_per_conv_s"] / rows[2]["cpu_ms_per_conv_s"],
    ]
    line = next(
        line
        for line in floor.summary(rows, ["asgi+codecs0", "asgi"], floor="asgi+codecs0").splitlines()
        if line.startswith("| asgi |")
    )
    assert f"({ratios[0]:.2f}, {ratios[1]:.2f})" in line


def test_a_failed_run_is_recorded_and_the_other_rounds_still_count(tmp_path, monkeypatch, capsys):
    """A run that fails (here the second server's clients never all stream) costs that run, not the table."""
    monkeypatch.setattr(floor, "RESULTS", tmp_path)

    class FakeServer:
        address = "127.0.0.1:1"

        def __init__(self, command):
            pass

        def stop(self):
            pass

    figures = iter([(20.0, 12.5), None, (21.0, 12.4), (14.0, 12.5)])  # round 1: ours, floor (fails); round 2

    async def drive(server, clients, pages, warmup, duration):
        ms = next(figures)
        if ms is None:
            async with trio.open_nursery():
                raise trio.TooSlowError
        return ms

    monkeypatch.setattr(floor, "ServerProcess", FakeServer)
    monkeypatch.setattr(floor, "drive", drive)
    monkeypatch.setattr(floor, "encode_pages", lambda seconds, ms: [])
    assert floor.main(["--clients", "2", "--variants", "ours", "asgi+codecs", "--rounds", "2", "--name", "t"]) == 1
    rows = json.loads((tmp_path / "t.json").read_text())["results"]
    assert [("error" in r, r.get("cpu_ms_per_conv_s")) for r in rows] == [
        (False, 20.0),
        (True, None),
        (False, 21.0),
        (False, 14.0),
    ]
    assert rows[1]["error"].startswith("TooSlowError")
    out = capsys.readouterr().out
    assert "round 1: asgi+codecs" in out and "failed: TooSlowError" in out
    ours = next(line for line in out.splitlines() if line.startswith("| ours |"))
    assert f"| 20.50 | {21.0 / 14.0:.2f} ({21.0 / 14.0:.2f}) | 12.45 |" in ours  # only round 2 has both figures
    floor_line = next(line for line in out.splitlines() if line.startswith("| asgi+codecs |"))
    assert "14.00 (1 run(s) failed)" in floor_line


def test_clients_that_never_stream_fail_the_run_with_a_reason(monkeypatch):
    """Within the connect timeout (on a virtual clock), and the error says how many were streaming."""

    async def never_streams(url, pages, trace, **kwargs):
        await trio.sleep_forever()

    class Server:
        address = "127.0.0.1:1"

    monkeypatch.setattr(floor.client, "converse", never_streams)
    with pytest.raises(ExceptionGroup) as caught:
        trio.run(floor.drive, Server(), 3, [], 0.0, 1.0, clock=trio.testing.MockClock(autojump_threshold=0))
    (error,) = caught.value.exceptions
    assert str(error) == f"0 of 3 clients were streaming after {floor.CONNECT_TIMEOUT:.0f} s"


def test_the_table_says_when_a_server_fell_behind():
    """A server that sent fewer frames did less work: its CPU figure is flagged, not silently compared."""
    rows = [
        {"variant": "ours", "round": 0, "cpu_ms_per_conv_s": 19.0, "audio_frames_per_s": 10.0},
        {"variant": "asgi+codecs", "round": 0, "cpu_ms_per_conv_s": 15.0, "audio_frames_per_s": 12.5},
        {"variant": "ours", "round": 1, "cpu_ms_per_conv_s": 18.0, "audio_frames_per_s": 12.4},
        {"variant": "asgi+codecs", "round": 1, "cpu_ms_per_conv_s": 15.0, "audio_frames_per_s": 12.5},
    ]
    table = floor.summary(rows, ["ours", "asgi+codecs"])
    ours = next(line for line in table.splitlines() if line.startswith("| ours |"))
    assert "| 11.20 (fell behind in 1 of 2) |" in ours  # 10.0 < 0.98 x 12.5; 12.4 is within it
    assert "fell behind" not in next(line for line in table.splitlines() if line.startswith("| asgi+codecs |"))
