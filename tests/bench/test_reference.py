"""``bench/reference.py``'s arithmetic: which output answers which frame, and what it adds up to.

No server runs here: the traces are made by hand, with the timing each
server's design implies, so that a mistake in matching outputs to frames
(the part of the benchmark that is easy to get subtly wrong) shows up as a
wrong turnaround.  One oracle test checks that moshi's own loader accepts
the config the benchmark writes for it, without touching the hub.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
import sys

import pytest
import trio

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "bench"))

import _reference_client as client  # noqa: E402
import _reference_env as refenv  # noqa: E402
import _reference_report as report  # noqa: E402

PAGE = 960  # samples in one 40 ms page
MOSHI_REQUIRES = [
    "numpy<2.3,>=1.26",
    "safetensors<0.8.0,>=0.4.0",
    "huggingface-hub<1.0.0,>=0.24",
    'bitsandbytes<0.50.0,>=0.45; sys_platform == "linux"',
    "einops<0.9,>=0.7",
    "sentencepiece<0.3,>=0.2.0",
    "sounddevice==0.5",
    "sphn<0.3.0,>=0.2.0",
    "torch<2.10,>=2.2.0",
    "aiohttp<3.12,>=3.10.5",
    "tqdm>=4.48",
    'pytest; extra == "dev"',
]


def sent_trace(pages: int, start: float = 1.0) -> client.Trace:
    """A client that sent ``pages`` audio pages, one every 40 ms from ``start``."""
    return client.Trace(
        0, connect_at=0.9, handshake_at=start, pages_sent_at=[start + i * client.PAGE_S for i in range(pages)]
    )


def completes(trace: client.Trace, frame: int, skipped: int = 0) -> float:
    """When the page holding the last sample of ``frame`` went out (960-sample pages)."""
    return trace.pages_sent_at[((frame + 1) * client.FRAME + skipped - 1) // PAGE]


def test_moshi_requirements_keep_their_pins_except_the_ones_left_out() -> None:
    keep, left = refenv.runtime_requirements(MOSHI_REQUIRES)
    assert keep == [
        "numpy<2.3,>=1.26",
        "safetensors<0.8.0,>=0.4.0",
        "huggingface-hub<1.0.0,>=0.24",
        "einops<0.9,>=0.7",
        "sentencepiece<0.3,>=0.2.0",
        "sphn<0.3.0,>=0.2.0",
        "aiohttp<3.12,>=3.10.5",
        "tqdm>=4.48",
    ]
    assert sorted(refenv.requirement_name(r) for r in left) == ["bitsandbytes", "sounddevice", "torch"]


def test_reference_outputs_answer_the_next_frame() -> None:
    """moshi.server: nothing for frame 0, then one output per frame, ``step`` after it completes."""
    trace = sent_trace(40)
    step = 0.031
    frames = client.complete_frames(trace, [PAGE] * 40)
    assert frames == 20
    trace.audio_at = [completes(trace, k) + step for k in range(1, frames)]
    turn = client.turnarounds(trace, client.reference_frame_map(len(trace.audio_at)), [PAGE] * 40)
    assert turn == pytest.approx([step] * (frames - 1))


def counters(at: float, frames_in: int, silence: int, skipped: int = 0, dropped: int = 0) -> client.Counters:
    return client.Counters(at, frames_in, silence, skipped, dropped)


def test_ours_outputs_follow_the_server_counters() -> None:
    """Ticks every 80 ms; two silence ticks first, a 960-sample skip later: those intervals are left out."""
    series = [
        counters(0.0, 0, 0),
        counters(0.5, 3, 2),  # head: two silence-fed ticks, then frames 0-2
        counters(1.0, 10, 2),  # ticks 5-11 consumed frames 3-9
        counters(1.5, 14, 2, skipped=PAGE),  # a skip somewhere in ticks 12-15
        counters(2.0, 18, 2, skipped=PAGE),  # ticks 16-19 consumed frames 14-17, shifted by one page
    ]
    mapping = client.ours_frame_map(20, series)
    assert mapping[:5] == [None] * 5
    assert mapping[5:12] == [(n, 0) for n in range(3, 10)]
    assert mapping[12:16] == [None] * 4
    assert mapping[16:] == [(n, PAGE) for n in range(14, 18)]

    trace = sent_trace(60)
    tick_wait, step = 0.025, 0.040
    trace.audio_at = [0.0] * 20
    for j, frame in enumerate(mapping):
        if frame is not None:
            trace.audio_at[j] = completes(trace, *frame) + tick_wait + step
    turn = client.turnarounds(trace, mapping, [PAGE] * 60)
    assert turn == pytest.approx([tick_wait + step] * 11)


def test_ours_outputs_are_not_matched_after_a_drop() -> None:
    series = [counters(0.0, 0, 0), counters(0.5, 5, 1), counters(1.0, 11, 1, dropped=1)]
    assert client.ours_frame_map(12, series) == [None] * 12


def test_frames_not_sent_are_not_timed() -> None:
    trace = sent_trace(10)  # five frames
    trace.audio_at = [2.0] * 8
    assert len(client.turnarounds(trace, [(n, 0) for n in range(8)], [PAGE] * 10)) == 5


def test_concurrency_counts_overlap_not_turns() -> None:
    one_at_a_time = [client.Trace(i, audio_at=[2.0 * i + 0.1, 2.0 * i + 1.0, 2.0 * i + 2.0]) for i in range(3)]
    assert client.max_concurrent(one_at_a_time) == 1  # the next starts exactly when the last ended
    together = [client.Trace(i, audio_at=[0.1 + 0.01 * i, 5.0]) for i in range(4)]
    assert client.max_concurrent(together + [client.Trace(9)]) == 4


def test_frames_within_counts_from_connect() -> None:
    trace = client.Trace(0, connect_at=1.0, audio_at=[1.2, 1.28, 3.0, 5.5])
    assert client.frames_within(trace, 2.0) == 3
    assert client.frames_within(client.Trace(1, connect_at=0.0), 2.0) == 0


def test_chat_url_has_the_official_query() -> None:
    url = client.chat_url("http://127.0.0.1:8998", text_temperature=0.7, text_topk=25)
    assert url == "ws://127.0.0.1:8998/api/chat?text_temperature=0.7&text_topk=25"


@pytest.mark.oracle
def test_moshi_loads_the_benchmark_checkpoint_offline(
    tmp_path: pathlib.Path, speech_wav: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moshi's CheckpointInfo reads moshi-config.json with local files only; card 2048, dep_q 8, sampling on."""
    pytest.importorskip("moshi")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import _reference_checkpoint as checkpoint
    import torch
    from moshi.models import loaders

    ckpt = checkpoint.build(tmp_path / "tiny", speech_wav)
    config = json.loads((ckpt / "config.json").read_text())
    args = checkpoint.reference_args(ckpt)
    flag = dict(zip(args[::2], args[1::2]))
    assert flag["--static"] == "none" and flag["--device"] == "cpu"
    info = loaders.CheckpointInfo.from_hf_repo(
        "no/such-repo",
        flag["--moshi-weight"],
        flag["--mimi-weight"],
        flag["--tokenizer"],
        config_path=flag["--config-path"],
    )
    lm = info.get_moshi("cpu", dtype=torch.float32)
    assert (lm.card, lm.dep_q, config["card"]) == (2048, 8, 2048)
    assert info.get_mimi("cpu").num_codebooks == 8
    assert info.lm_gen_config == checkpoint.LM_GEN_CONFIG


def single_run(side: str, turnaround_ms: list[float]) -> dict:
    trace = sent_trace(10)
    trace.audio_at = [1.2 + 0.08 * i for i in range(len(turnaround_ms))]
    return {
        "trace": dataclasses.asdict(trace),
        "complete_frames": 5,
        "cpu_percent": 40.0,
        "mapped_outputs": len(turnaround_ms),
        "turnaround_ms": turnaround_ms,
        "handshake_ms": 10.0,
        "first_audio_ms": 100.0 if side == "ours" else 160.0,
    }


def many_run(n: int, serial: bool) -> dict:
    traces = []
    for i in range(n):
        start = 8.0 * i if serial else 0.1
        traces.append(
            dataclasses.asdict(
                client.Trace(
                    i,
                    connect_at=0.0,
                    handshake_at=start,
                    audio_at=[start + 0.1 + 0.08 * k for k in range(100)],
                    closed_at=start + 9.0,
                )
            )
        )
    return {"clients": n, "traces": traces, "wall_s": 9.0 * n, "cpu_percent": 50.0, "server_step_ms_p50": 40.0}


def test_report_puts_the_two_servers_side_by_side(tmp_path: pathlib.Path) -> None:
    runs = {"reference": [single_run("reference", [50.0, 55.0])], "ours": [single_run("ours", [60.0, 65.0])]}
    single = {side: report.summarize_single(runs[side]) for side in report.SIDES}
    assert single["ours"]["turnaround_ms"]["p50"] == pytest.approx(62.5)
    rows = report.single_rows(single)
    assert rows[0] == ["single conversation", "reference", "ours", "ours/ref"]
    assert ["handshake -> first audio, ms", "160.0 [160.0-160.0]", "100.0 [100.0-100.0]", "0.62"] in rows

    many_runs = {"reference": {"4": many_run(4, serial=True)}, "ours": {"4": many_run(4, serial=False)}}
    many = {side: {n: report.summarize_many(r, 8.0) for n, r in many_runs[side].items()} for side in report.SIDES}
    assert (many["reference"]["4"]["concurrent"], many["ours"]["4"]["concurrent"]) == (1, 4)
    assert many["ours"]["4"]["fps_per_client"]["mean"] == pytest.approx(98 / 8)  # audio at 0.2 s + 80 ms * k
    assert many["reference"]["4"]["fps_per_client"]["min"] == 0.0
    text = report.table(report.many_rows(many, 8.0))
    assert "N=4: served at once" in text and "4.00" in text

    report.plot(
        {"single_runs": runs, "many": many, "many_runs": many_runs, "checkpoint_spec": "tiny"}, tmp_path / "plot.png"
    )
    assert (tmp_path / "plot.png").stat().st_size > 0

    data = {
        "single_runs": runs,
        "many_runs": many_runs,
        "single": single,
        "many": many,
        "checkpoint_spec": "tiny",
        "reference_venv_versions": {"moshi": "0.2.13"},
        "command": "python bench/reference.py",
        "date": "today",
        "cpus": 2,
        "load_before": [0.5],
        "load_after": [0.7],
        "scenarios_rerun": 1,
        "server_side": {"reference_frame_ms": 55.0, "ours_tick_engine_ms": 37.0, "ours_added_latency_ms": 38.0},
        "args": {
            "load_duration": "8.0",
            "repeats": "1",
            "duration": "20.0",
            "our_slots": "0",
            "torch_threads": "1",
            "busy_limit": "0.5",
        },
    }
    text = report.render(data)
    assert "# python bench/reference.py" in text and "our server --slots = N" in text
    assert "1 scenario(s) run again" in text and "audio frames/s per client, first 8 s" in text


def test_scrape_times_are_dense_at_first_then_sparse():
    times = list(itertools.islice(client.scrape_times(0.5, 2.0, 4.0), 7))
    assert times == [0.5, 1.0, 1.5, 2.0, 6.0, 10.0, 14.0]


async def test_scrape_while_reads_at_its_times_and_once_at_the_end(autojump_clock):
    reads = []

    async def read():
        reads.append(trio.current_time())
        return len(reads)

    running, into = trio.Event(), []
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.scrape_while, running, read, into, [1.0, 2.0, 10.0])
        await trio.sleep(3.0)
        running.set()
    assert [t - start for t in reads] == [1.0, 2.0, 3.0] and into == [1, 2, 3]
