"""bench/webrtc: WebRTC against the Realtime WebSocket on a lossy network, and what a WebRTC call costs the server.

Usage (from the repository root)::

    python bench/webrtc.py            # the loss table, then CPU at N = 16 and 32
    python bench/webrtc.py --quick    # lossless and 5 % only, N = 2, a 3 s window (a smoke run)

**The loss table.** One server (``serve --model echo``: the echo engine returns what the model heard), one call
per row: 1 s of silence, 2 s of real speech (``speech_assistant.wav`` from 3.2 s), 2.5 s of silence, at real
time in 20 ms packets; the loss is on the way in (caller → server; the way back is clean, so the echo is what
the model heard). For each row:

* **speech frames heard**: the caller's 80 ms speech frames that reached the model whole (a concealed packet
  counts: made up, heard; missing or silenced audio does not; ``tests/_helpers/webrtc.lost_frames``);
* **turnaround**: median, from the packet that completes a speech frame leaving the caller to its echo arriving
  back; beside it, the change from the same transport's lossless row.

WebRTC runs aiortc's caller (``tests/_helpers/webrtc.py``) through the tests' UDP relay (seeded random loss per
packet; jitter: each packet held 0..40 ms, so packets reorder). The Realtime WebSocket sends 20 ms
``input_audio_buffer.append`` events through a TCP relay: TCP does not lose data, it delays it, so a "lost"
chunk (at the same rate, per chunk the client wrote) is held for a retransmission timeout (200 ms, Linux's
minimum RTO) and everything behind it waits (head-of-line blocking); jitter holds each chunk 0..40 ms, in
order.

**CPU per conversation-second.** The server process's own CPU (``/proc``: user + system, its threads, not its
children) over a fixed window while N callers talk (speech in turns, at real time), WebRTC then the Realtime
WebSocket, each against a fresh ``serve --model echo --slots N``, ``--repeats`` times (3) in alternation; each
figure is the median of its runs (the runs beside it). The callers run in a child process of their own, so their
CPU is not counted; the WebRTC callers send what a browser sends (mono Opus, 32 kbit/s, made beforehand), and the
packets the server received per call and second are shown: below 47.5 (of 50) the callers fell behind real time
and the run is flagged. The window starts once every call is live; the sessions are counted at both ends of it (a
server that lost callers is flagged). The issue's target: WebRTC at most 1.5 times the WebSocket.

Writes ``bench/results/NAME.json`` (``--results DIR``) and prints both tables.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import pathlib
import random
import re
import statistics
import subprocess
import sys
import time
import wave
from typing import Any

import numpy as np
import soxr
import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from _serverproc import ServerProcess  # noqa: E402

from _helpers.udp_relay import Direction, UdpRelay  # noqa: E402
from _helpers.webrtc import FRAME, RATE, Caller, echoed_frames, lost_frames  # noqa: E402
from pplex_trio.client import open_websocket  # noqa: E402
from pplex_trio.codec import pcm16_decode, pcm16_encode  # noqa: E402

logger = logging.getLogger("bench.webrtc")
DATA = REPO.parent / "shared" / "data"
WS_RATE, CHUNK = 24_000, 480  # the Realtime WebSocket's PCM16 rate; 20 ms of it per append
RTO = 0.200  # Linux's minimum retransmission timeout: what a lost segment holds the stream for
JITTER = 0.040
LEAD, TAIL = 1.0, 2.5  # seconds of silence before the speech (the framer finds the caller) and after it
CONDITIONS = (("lossless", 0.0, 0.0), ("5 % loss", 0.05, 0.0), ("15 % loss", 0.15, 0.0), ("40 ms jitter", 0.0, JITTER))


def speech(start: float = 3.2, seconds: float = 2.0) -> np.ndarray:
    """Real speech at 48 kHz (the tests' ``speech`` fixture by default)."""
    with wave.open(str(DATA / "speech_assistant.wav")) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    return soxr.resample(pcm[int(start * rate) : int((start + seconds) * rate)], rate, RATE).astype(np.float32)


def row(transport: str, condition: str, utterance: np.ndarray, received: np.ndarray, heard_at: Any, mouth: Any) -> dict:
    """The table's row: ``received`` is the echo at 48 kHz; ``heard_at(i)`` when its sample ``i`` arrived;
    ``mouth(k)`` when the packet completing the utterance's frame ``k`` left the caller."""
    lost, frames = lost_frames(utterance, received)
    found = [heard_at(k * FRAME + lag) - mouth(k) for k, lag, s in echoed_frames(utterance, received) if s > 0.5]
    return {
        "transport": transport,
        "condition": condition,
        "speech_frames": frames,
        "speech_frames_heard": frames - len(lost),
        "turnaround_ms": round(statistics.median(found) * 1000, 1) if found else float("nan"),
    }


# -- WebRTC ------------------------------------------------------------------------------------------------


def webrtc_call(url: str, utterance: np.ndarray, loss: float, jitter: float, seed: int) -> dict:
    """One call through the UDP relay; its row."""

    async def run() -> tuple[Caller, int, UdpRelay]:
        relay = UdpRelay(up=Direction(loss=loss, jitter=jitter), seed=seed)
        caller = Caller()
        try:
            response = await caller.call(url, through=relay)
            assert response.status_code == 201, response.text
            await asyncio.wait_for(caller.opened.wait(), 30)
            await asyncio.sleep(LEAD)
            said = caller.microphone.say(utterance)
            await asyncio.sleep(utterance.size / RATE + TAIL)
        finally:
            await caller.close()
            relay.close()
        return caller, said, relay

    caller, said, relay = asyncio.run(run())
    started = caller.microphone.started_at
    assert started is not None
    result = row(
        "WebRTC",
        "",
        utterance,
        caller.received(),
        lambda i: caller.audio_at[min(i // 960, len(caller.audio_at) - 1)],
        lambda k: started + (said + (k + 1) * FRAME) / RATE,
    )
    result["packets_lost"] = relay.up.rtp_dropped
    return result


# -- the Realtime WebSocket through a TCP relay --------------------------------------------------------------


async def tcp_relay(listener: trio.SocketListener, upstream: int, loss: float, jitter: float, seed: int) -> None:
    """Serve one connection: the client's bytes to ``upstream`` (a "lost" chunk held ``RTO``, each chunk held
    0..``jitter``, always in order), the server's back as they come."""
    rng = random.Random(seed)
    async with listener:
        client = await listener.accept()
    async with client, await trio.open_tcp_stream("127.0.0.1", upstream) as server:
        await _relay(client, server, rng, loss, jitter)


async def _relay(
    client: trio.SocketStream, server: trio.SocketStream, rng: random.Random, loss: float, jitter: float
) -> None:
    send, receive = trio.open_memory_channel[tuple[float, bytes]](10_000)

    async def read_up() -> None:
        while data := await client.receive_some(65536):
            hold = RTO if loss and rng.random() < loss else rng.uniform(0, jitter) if jitter else 0.0
            await send.send((trio.current_time() + hold, data))
        await send.aclose()

    async def write_up() -> None:
        due = 0.0
        async for at, data in receive:
            due = max(due, at)  # (in order: nothing overtakes a held chunk)
            await trio.sleep_until(due)
            await server.send_all(data)

    async def down() -> None:
        while data := await server.receive_some(65536):
            await client.send_all(data)

    async with trio.open_nursery() as nursery:
        for task in (read_up, write_up, down):
            nursery.start_soon(task)


async def ws_call(address: str, utterance: np.ndarray, loss: float, jitter: float, seed: int) -> dict:
    """One Realtime WebSocket conversation through the TCP relay; its row."""
    pcm = soxr.resample(utterance, RATE, WS_RATE).astype(np.float32)
    stream = np.concatenate([np.zeros(int(LEAD * WS_RATE), np.float32), pcm, np.zeros(int(TAIL * WS_RATE), np.float32)])
    first = int(LEAD * WS_RATE) // CHUNK  # the chunk the speech starts in
    sent: list[float] = []
    echo: list[np.ndarray] = []
    arrived: list[tuple[int, float]] = []  # (samples received so far, when)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(tcp_relay, listeners[0], int(address.rsplit(":", 1)[1]), loss, jitter, seed)
        async with open_websocket(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            await ws.send_message('{"type":"response.create"}')
            while not (await ws.get_message()).startswith('{"type":"response.created"'):
                pass

            async def listen() -> None:
                total = 0
                while True:
                    message = await ws.get_message()
                    if message.startswith('{"type":"response.output_audio.delta"'):
                        echo.append(pcm16_decode(base64.b64decode(json.loads(message)["delta"])))
                        total += echo[-1].size
                        arrived.append((total, trio.current_time()))

            async with trio.open_nursery() as inner:
                inner.start_soon(listen)
                deadline = trio.current_time()
                for i in range(0, stream.size - CHUNK + 1, CHUNK):
                    await trio.sleep_until(deadline)
                    chunk = base64.b64encode(pcm16_encode(stream[i : i + CHUNK])).decode()
                    sent.append(trio.current_time())
                    await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
                    deadline += CHUNK / WS_RATE
                await trio.sleep(0.5)
                inner.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    received = soxr.resample(np.concatenate(echo), WS_RATE, RATE).astype(np.float32) if echo else np.zeros(0)
    ends = np.array([n for n, _ in arrived]) * RATE // WS_RATE
    times = [t for _, t in arrived]
    return row(
        "Realtime WebSocket",
        "",
        utterance,
        received,
        lambda i: times[min(int(np.searchsorted(ends, i, side="right")), len(times) - 1)],
        lambda k: sent[first + (k + 1) * FRAME // 960 - 1],
    )


def loss_table(utterance: np.ndarray, seed: int, conditions: tuple = CONDITIONS) -> list[dict]:
    """Every condition on each transport, against one echo server."""
    server = ServerProcess(["-m", "pplex_trio", "serve", "--model", "echo", "--port", "0"], cwd=str(REPO))
    rows = []
    try:
        url = "http://" + server.address
        for n, (condition, loss, jitter) in enumerate(conditions):
            for transport in ("WebRTC", "Realtime WebSocket"):
                if transport == "WebRTC":
                    result = webrtc_call(url, utterance, loss, jitter, seed + n)
                else:
                    result = trio.run(ws_call, server.address, utterance, loss, jitter, seed + n)
                result["condition"] = condition
                rows.append(result)
                logger.info("%s", result)
    finally:
        server.stop()
    for result in rows:
        clean = next(r for r in rows if r["transport"] == result["transport"] and r["condition"] == "lossless")
        result["turnaround_change_ms"] = round(result["turnaround_ms"] - clean["turnaround_ms"], 1)
    return rows


def cpu_run(transport: str, clients: int, window: float, page_ms: int) -> dict:
    """``clients`` callers of ``transport`` (webrtc or realtime) against a fresh echo server: the server's CPU
    per conversation-second over ``window``."""
    server = ServerProcess(
        ["-m", "pplex_trio", "serve", "--model", "echo", "--slots", str(clients), "--port", "0"], cwd=str(REPO)
    )
    seconds = window + 30
    child = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "_webrtc_callers.py"), transport, str(clients), server.address]
        + [str(seconds), str(page_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # "live" once every call is
        if line.strip() != "live":
            raise RuntimeError(f"the {transport} callers did not all go live: {line!r}")
        time.sleep(2.0)  # (past the calls' start-up)
        sessions_before = len(_sessions(server.address))
        packets_before = _packets_received(server.address)
        cpu_before, at = server.cpu_seconds(), time.monotonic()
        time.sleep(window)
        cpu, elapsed = server.cpu_seconds() - cpu_before, time.monotonic() - at
        packets = _packets_received(server.address) - packets_before
        sessions_after = len(_sessions(server.address))
        child.terminate()
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
        server.stop()
    return {
        "transport": transport,
        "clients": clients,
        "window_s": round(elapsed, 2),
        "sessions_at_start": sessions_before,
        "sessions_at_end": sessions_after,
        "cpu_s": round(cpu, 3),
        "cpu_ms_per_conversation_s": round(1000 * cpu / (clients * elapsed), 2),
        "server_cpu_percent": round(100 * cpu / elapsed, 1),
        "packets_per_call_s": round(packets / (clients * elapsed), 1),  # (WebRTC: 50 at real time)
    }


def _packets_received(address: str) -> float:
    """The caller packets the server's WebRTC calls received so far (``/metrics``)."""
    import httpx

    text = httpx.get(f"http://{address}/metrics", timeout=10, trust_env=False).text
    found = re.search(r'^pplex_webrtc_packets_total\{kind="received"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _sessions(address: str) -> list[Any]:
    import httpx

    return httpx.get(f"http://{address}/api/sessions", timeout=10, trust_env=False).json()["sessions"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="16,32", help="N for the CPU runs (default 16,32)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of the CPU window (default 20)")
    parser.add_argument(
        "--ws-page-ms", type=int, default=40, help="audio per WebSocket append (default 40, as load.py)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="CPU runs of each transport at each N (median)")
    parser.add_argument("--seed", type=int, default=1, help="the relays' random seed")
    parser.add_argument(
        "--quick", action="store_true", help="lossless and 5 %% only, N = 2 and a 3 s window: a smoke run"
    )
    parser.add_argument("--no-loss-table", action="store_true", help="only the CPU runs")
    parser.add_argument("--no-cpu", action="store_true", help="only the loss table")
    parser.add_argument("--name", default="webrtc")
    parser.add_argument("--results", type=pathlib.Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.quick:
        args.clients, args.window, args.repeats = "2", 3.0, 1
    conditions = CONDITIONS[:2] if args.quick else CONDITIONS
    rows = [] if args.no_loss_table else loss_table(speech(), args.seed, conditions)
    cpu = []
    if not args.no_cpu:
        for n in (int(c) for c in args.clients.split(",")):
            for _ in range(args.repeats):  # (alternating: a machine's slower minutes fall on both)
                cpu += [cpu_run(t, n, args.window, args.ws_page_ms) for t in ("webrtc", "realtime")]
    if rows:
        print(
            "loss on the way in (caller → server); TCP: a lost chunk holds the stream for a 200 ms RTO (head-of-line)"
        )
        print(f"{'condition':14} {'transport':20} {'speech frames heard':>20} {'turnaround':>11} {'vs lossless':>12}")
        for r in rows:
            print(
                f"{r['condition']:14} {r['transport']:20} {r['speech_frames_heard']:>11} of {r['speech_frames']:<5}"
                f" {r['turnaround_ms']:>8.0f} ms {r['turnaround_change_ms']:>+9.0f} ms"
            )
    if cpu:
        print(
            "\nserver CPU per conversation-second (echo engine; the callers in a process of their own; WebRTC: 20 ms "
            f"Opus packets, WebSocket: {args.ws_page_ms} ms appends)"
        )
        for n in sorted({r["clients"] for r in cpu}):
            median = {}
            for transport in ("webrtc", "realtime"):
                runs = [r for r in cpu if r["clients"] == n and r["transport"] == transport]
                figures = sorted(r["cpu_ms_per_conversation_s"] for r in runs)
                median[transport] = statistics.median(figures)
                kept = all(r["sessions_at_start"] == r["sessions_at_end"] == n for r in runs)
                rate = min(r["packets_per_call_s"] for r in runs)
                spread = f" (runs: {', '.join(f'{f:.2f}' for f in figures)})" if len(figures) > 1 else ""
                print(
                    f"N={n:<3} {transport:9} {median[transport]:>7.2f} ms/conv-s{spread}"
                    f"  {statistics.median(r['server_cpu_percent'] for r in runs):.0f} % of a core"
                    + (f", {rate:.1f} packets/s a call" if transport == "webrtc" else "")
                    + ("" if kept else "  (NOT ALL LIVE: do not compare)")
                    + ("  (CALLERS BEHIND REAL TIME: do not compare)" if transport == "webrtc" and rate < 47.5 else "")
                )
            ratio = median["webrtc"] / median["realtime"]
            for r in cpu:
                if r["clients"] == n and r["transport"] == "webrtc":
                    r["ratio_to_websocket_median"] = round(ratio, 2)
            print(f"N={n:<3} WebRTC / WebSocket = {ratio:.2f}x (target <= 1.5x)")
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{args.name}.json").write_text(json.dumps({"loss": rows, "cpu": cpu}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
