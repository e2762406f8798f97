"""bench/load: its percentile and CPU-ratio arithmetic, its pre-encoded streams, and short real runs."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from _metrics import Histogram  # noqa: E402


def test_histogram_quantile_interpolates_like_prometheus():
    rng = np.random.default_rng(0)
    samples = rng.uniform(0, 0.1, 100_000)
    bounds = [0.01 * k for k in range(1, 11)] + [float("inf")]
    counts = [float((samples <= b).sum()) for b in bounds]
    hist = Histogram(bounds, counts)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert hist.quantile(q) == pytest.approx(np.quantile(samples, q), abs=0.002)
    empty = Histogram(bounds, [0.0] * len(bounds))
    assert np.isnan(empty.quantile(0.5))


def test_pre_encoded_stream_starts_with_its_headers():
    from load import encode_pages

    from _helpers.ogg import is_bos, page_sequence

    pages = encode_pages(2.0, 40)
    assert is_bos(pages[0]) and pages[0][28:36] == b"OpusHead"
    assert [page_sequence(p) for p in pages] == list(range(len(pages)))
    assert len(pages) == 2 + 2 * 25  # headers + two 40 ms pages per 80 ms frame


def test_json_streams_carry_40_ms_of_pcm16_per_append():
    import base64
    import json

    from load import encode_stream

    for protocol, event in (("realtime", "input_audio_buffer.append"), ("live", "session.input_audio.append")):
        appends = [json.loads(m) for m in encode_stream(protocol, 2.0, 40)]
        assert {a["type"] for a in appends} == {event}
        assert len(appends) == 2 + 50  # two silent ones standing in for the headers, then 2 s of 40 ms
        assert {len(base64.b64decode(a["audio"])) for a in appends} == {960 * 2}  # 40 ms at 24 kHz, PCM16


def test_a_twilio_stream_is_twilios_opening_then_20_ms_of_mulaw_per_media_event():
    import base64
    import json

    from _load_clients import JSON_EVENTS, encode_stream, speech

    from _helpers.twilio import now, reference_serializer, ulaw_to_float

    twilio = JSON_EVENTS["twilio"]
    assert [json.loads(m)["event"] for m in twilio.start] == ["connected", "start"]
    media = encode_stream("twilio", 6.0, 40)  # (Twilio's pace, whatever the page size asked)
    assert len(media) == 2 + 300 and twilio.message_ms == 20
    serializer = reference_serializer()  # Pipecat's reading of Twilio's media events
    frames = [now(serializer.deserialize(m)) for m in media]
    assert all(len(f.audio) == 160 * 2 for f in frames)  # 20 ms at 8 kHz, as 16-bit PCM
    heard = np.concatenate([ulaw_to_float(base64.b64decode(json.loads(m)["media"]["payload"])) for m in media[2:]])
    sent = speech(6.0)[::3]  # the same speech (its first 3 s are silent), roughly at 8 kHz (the bench resamples it)
    assert np.abs(heard[:20_000]).max() < 0.01 and np.abs(heard).max() > 0.3
    assert np.corrcoef(heard[100:-100], sent[100:-100])[0, 1] > 0.9


def test_cpu_ratios_set_each_protocol_against_moshi_and_live_against_realtime():
    from load import RunResult, cpu_ratios, protocols_summary

    def run(protocol, tree_cpu_percent):
        fields = {
            f: 0
            for f in RunResult.__dataclass_fields__
            if f not in ("label", "per_session", "latency_cdf", "stages_p50_ms", "cpu_ratios")
        }
        return RunResult(
            **(fields | dict(label=protocol, clients=10, tree_cpu_percent=tree_cpu_percent, sessions_ok=10))
        )

    runs = {"moshi": run("moshi", 100.0)}  # 100 % over 10 conversations: 100 ms per conversation-second
    assert runs["moshi"].cpu_ms_per_conversation_second == pytest.approx(100.0)
    assert cpu_ratios(runs, "moshi") == {}
    runs["realtime"] = run("realtime", 80.0)
    runs["realtime"].cpu_ratios = cpu_ratios(runs, "realtime")
    runs["live"] = run("live", 92.0)
    runs["live"].cpu_ratios = cpu_ratios(runs, "live")
    runs["twilio"] = run("twilio", 120.0)
    runs["twilio"].cpu_ratios = cpu_ratios(runs, "twilio")
    assert runs["twilio"].cpu_ratios == pytest.approx({"realtime": 1.5})
    assert runs["realtime"].cpu_ratios == pytest.approx({"moshi": 0.8})
    assert runs["live"].cpu_ratios == pytest.approx({"moshi": 0.92, "realtime": 1.15})
    assert list(runs["live"].cpu_ratios) == ["moshi", "realtime"]
    summary = protocols_summary(runs)
    assert "0.80x moshi (target <= 1.2: met)" in summary and "1.50x realtime" in summary
    assert "1.15x realtime (target <= 1.1: NOT met)" in summary


@pytest.mark.serial
def test_short_load_run_reports_every_session(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "bench/load.py",
            "--clients",
            "2",
            "--duration",
            "2",
            "--warmup",
            "1",
            "--name",
            "smoke",
            "--results",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "smoke.json").read_text())
    result = report["results"][0]
    assert result["sessions_ok"] == 2
    assert result["received_frames"] > 0 and result["sent_frames"] > 0
    assert "real time" in proc.stdout
    assert (tmp_path / "smoke.png").stat().st_size > 0


@pytest.mark.serial
def test_the_protocols_side_by_side(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "bench/load.py",
            "--clients",
            "2",
            "--duration",
            "2",
            "--warmup",
            "1",
            "--compare-protocols",
            "--name",
            "protocols",
            "--results",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    moshi, realtime, live, twilio = json.loads((tmp_path / "protocols.json").read_text())["results"]
    assert [r["label"].split(",")[0] for r in (moshi, realtime, live, twilio)] == [
        "moshi",
        "realtime",
        "live",
        "twilio",
    ]
    for result in (moshi, realtime, live, twilio):
        assert result["sessions_ok"] == 2 and result["received_frames"] > 0.8 * result["sent_frames"] > 0
    assert moshi["cpu_ratios"] == {} and list(realtime["cpu_ratios"]) == ["moshi"]
    assert list(live["cpu_ratios"]) == ["moshi", "realtime"] and list(twilio["cpu_ratios"]) == ["realtime"]
    assert "server CPU per conversation-second:" in proc.stdout and "x realtime (target <= 1.1" in proc.stdout


def test_a_list_of_protocols_runs_in_its_order_and_an_unknown_one_is_refused():
    """``--compare-protocols realtime,twilio`` (the side-by-side run above runs every protocol, Twilio's too)."""
    import argparse

    from load import protocol_list

    assert protocol_list("realtime,twilio") == ("realtime", "twilio")
    assert protocol_list(" twilio , moshi ") == ("twilio", "moshi")
    for bad in ("realtime,sip", ",", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="give protocols among"):
            protocol_list(bad)


def test_compare_transcribe_sets_the_transcriber_against_off_and_refuses_the_echo_engine(capsys):
    """``--compare-transcribe``: its parsing, and the ratio and summary it prints (no run)."""
    from load import RunResult, main, transcribe_ratio, transcribe_summary

    def run(tree_cpu_percent, **more):
        fields = {
            f: 0
            for f in RunResult.__dataclass_fields__
            if f not in ("label", "per_session", "latency_cdf", "stages_p50_ms", "cpu_ratios")
        }
        return RunResult(
            **(fields | dict(label="tiny", clients=2, tree_cpu_percent=tree_cpu_percent, sessions_ok=2) | more)
        )

    runs = {"off": run(50.0)}  # 50 % over 2 conversations: 250 ms per conversation-second
    assert transcribe_ratio(runs, "off") == {} and transcribe_ratio({"tiny": run(1.0)}, "tiny") == {}
    runs["tiny"] = run(65.0, ticks_skipped=3, lateness_p99_ms=12.0)
    runs["tiny"].cpu_ratios = transcribe_ratio(runs, "tiny")
    assert runs["tiny"].cpu_ratios == pytest.approx({"off": 1.3})
    summary = transcribe_summary(runs)
    assert "--transcribe off     250.0 ms  tick" in summary and "real time yes" in summary
    assert "325.0 ms  1.30x off" in summary and "ticks skipped 3" in summary and "real time NO" in summary

    for argv, why in (
        (["--compare-transcribe"], "the echo engine has none"),
        (["--transcribe", "tiny"], "the echo engine has none"),
        (["--model", "tiny", "--compare-transcribe", "off"], "name the transcriber"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert why in capsys.readouterr().err
