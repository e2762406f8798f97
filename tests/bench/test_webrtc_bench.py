"""bench/webrtc: its TCP relay's head-of-line blocking, and a quick real run."""

import json
import pathlib
import subprocess
import sys

import pytest
import trio

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import webrtc  # noqa: E402


async def through_relay(loss: float, jitter: float, gaps: list[float]) -> list[tuple[float, float, bytes]]:
    """Chunks written with ``gaps`` between them through ``tcp_relay``: (when written, when they came, what)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    upstream = await trio.open_tcp_listeners(0, host="127.0.0.1")
    got: list[tuple[float, bytes]] = []
    sent: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(webrtc.tcp_relay, listeners[0], upstream[0].socket.getsockname()[1], loss, jitter, 7)

        async def server() -> None:
            async with upstream[0]:
                stream = await upstream[0].accept()
            async with stream:
                while data := await stream.receive_some(65536):
                    got.append((trio.current_time(), data))

        nursery.start_soon(server)
        async with await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1]) as client:
            for n, gap in enumerate(gaps):
                await trio.sleep(gap)
                sent.append(trio.current_time())
                await client.send_all(bytes([n]) * 10)
            await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    return [(sent[data[0]], at, data) for at, data in got]


def test_a_lost_chunk_holds_the_stream_for_an_rto_and_what_follows_waits_behind_it():
    chunks = trio.run(through_relay, 1.0, 0.0, [0.0, 0.05])  # (every chunk lost once)
    assert b"".join(data for _, _, data in chunks) == bytes([0]) * 10 + bytes([1]) * 10  # in order, whole
    for sent, came, _ in chunks:
        assert webrtc.RTO - 0.005 <= came - sent <= webrtc.RTO + 0.1


def test_jitter_holds_each_chunk_up_to_its_bound_in_order():
    chunks = trio.run(through_relay, 0.0, 0.04, [0.02] * 20)
    assert b"".join(data for _, _, data in chunks) == b"".join(bytes([n]) * 10 for n in range(20))
    assert all(0 <= came - sent <= 0.04 + 0.05 for sent, came, _ in chunks)


@pytest.mark.serial
def test_a_quick_run_fills_both_tables(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/webrtc.py", "--quick", "--name", "smoke", "--results", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "smoke.json").read_text())
    rows = {(r["transport"], r["condition"]): r for r in report["loss"]}
    assert set(rows) == {(t, c) for t in ("WebRTC", "Realtime WebSocket") for c in ("lossless", "5 % loss")}
    for transport in ("WebRTC", "Realtime WebSocket"):
        clean = rows[(transport, "lossless")]
        assert clean["speech_frames_heard"] == clean["speech_frames"] > 15
        assert 0 < clean["turnaround_ms"] < 1000
    assert rows[("WebRTC", "5 % loss")]["packets_lost"] > 0
    assert {(r["transport"], r["clients"]) for r in report["cpu"]} == {("webrtc", 2), ("realtime", 2)}
    assert all(r["sessions_at_start"] == r["sessions_at_end"] == 2 and r["cpu_s"] > 0 for r in report["cpu"])
    webrtc = next(r for r in report["cpu"] if r["transport"] == "webrtc")
    assert 45 < webrtc["packets_per_call_s"] < 55  # the callers kept real time: 50 packets a second each
    assert "WebRTC / WebSocket" in proc.stdout and "head-of-line" in proc.stdout
