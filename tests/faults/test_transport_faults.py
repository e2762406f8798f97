"""Clients that misbehave at the transport level, at every phase of a session, on both protocols.

Each case runs beside a *witness*: a raw conversation that streams known audio
the whole time and must get every frame back, exactly.  A bad client is
brought to a phase (connected, queued, preparing, live, closing) and then
misbehaves: it stops reading (with a small receive buffer), freezes, resets
the connection (SO_LINGER 0), sends fragments forever, or sends a frame
header claiming a gigabyte and nothing more.  Every case must end with the bad
session gone within the client timeout (plus the second the transport allows
a write), every slot free and the server answering.  The real clock and real
sockets: these are faults of the transport, which no fake can show.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from functools import partial

import httpx
import numpy as np
import pytest
import trio

from _helpers.bad_client import CLIENT_TIMEOUT, LIMIT, BadClient, frame_header, masked_frame
from _helpers.ws import RawWitness, raw_open
from pplex_trio.client import open_websocket

pytestmark = pytest.mark.serial  # their witnesses need the CPU: they run after the parallel suite

PATHS = {"raw": "/v1/audio/duplex", "moshi": "/api/chat?voice_prompt=NATF0.pt", "realtime": "/v1/realtime"}
OPEN = json.dumps({"type": "open"})
APPEND = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(3840)).decode()})
PROTOCOLS = ["raw", "moshi", "realtime"]
PHASES = ["connected", "queued", "preparing", "live", "closing"]
BEHAVIOURS = ["stop_reading", "freeze", "reset", "fragments", "header_only"]
GONE_WITHIN = CLIENT_TIMEOUT + 1 + 2.5  # the timeout, the transport's extra second, the close budget and slack


async def get(port: int, path: str) -> dict:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{port}{path}", timeout=5)
        return response.json()


async def drained(port: int) -> dict:
    """/health once the last slot has drained (a slot is freed at the tick after its session ends)."""
    with trio.move_on_after(2):
        while (health := await get(port, "/health"))["slots_free"] != 2:
            await trio.sleep(0.02)
    return health


async def newest_session(port: int, after: int) -> dict | None:
    sessions = [s for s in (await get(port, "/api/sessions"))["sessions"] if s["id"] > after]
    return sessions[-1] if sessions else None


async def wait_for_state(port: int, after: int, state: str) -> None:
    with trio.fail_after(10):
        while (session := await newest_session(port, after)) is None or session["state"] != state:
            await trio.sleep(0.02)


async def start_witness(nursery, server) -> RawWitness:
    """A raw conversation streaming known audio beside the bad client; check it at the end."""
    witness = RawWitness(server.handle.ws_url)
    nursery.start_soon(witness.run)
    with trio.fail_after(10):
        await witness.ready.wait()
    return witness


async def witness_talks_on_then_ends(witness: RawWitness, health: Callable[[], Awaitable[dict]]) -> None:
    """After the bad client is gone the witness goes on talking a while, then ends; it lost nothing."""
    await trio.sleep(0.6)
    witness.stop.set()
    with trio.fail_after(10):
        while (await health())["sessions"]:
            await trio.sleep(0.05)
    witness.check()


async def bring_to(phase: str, protocol: str, bad: BadClient, port: int, after: int) -> None:
    """Take the bad client's conversation to ``phase``, behaving well on the way."""
    if phase == "connected":
        return
    if protocol == "raw":
        await bad.send(OPEN)
    if protocol == "realtime":
        await bad.send(APPEND)  # the first audio starts the conversation
    if phase in ("queued", "preparing"):
        await wait_for_state(port, after, phase)
        return
    with trio.fail_after(10):
        while True:
            message = await bad.receive()
            if message == b"\x00" or (isinstance(message, str) and
                                        json.loads(message)["type"] in ("ready", "response.created")):
                break
    if phase == "closing":
        if protocol == "raw":
            await bad.send(np.zeros(1920 * 3, "<f4").tobytes())
            await bad.send(json.dumps({"type": "close"}))  # the flush is still running when it misbehaves
        elif protocol == "realtime":
            await bad.send(b"binary frames are refused")  # the server starts closing (1003)
        else:
            await bad.send("text frames are refused")  # the server starts closing (1003)


async def misbehave(behaviour: str, bad: BadClient) -> None:
    if behaviour in ("stop_reading", "freeze"):
        return  # from now on it reads nothing (and sends nothing)
    if behaviour == "reset":
        bad.reset()
        return
    if behaviour == "header_only":
        await bad.send_raw(frame_header(1 << 30))
        code, _ = await bad.read_until_closed(timeout=3)
        assert code in (1009, None)  # refused at the header (None: the reset beat the close frame here)
        return
    sent = 0  # fragments: a message that never ends must be refused once it passes the limit
    try:
        await bad.send_raw(masked_frame(b"x" * 4096, opcode=0x2, fin=False))
        with trio.fail_after(10):
            while True:
                await bad.send_raw(masked_frame(b"x" * 4096, opcode=0x0, fin=False))
                sent += 4096
                assert sent <= LIMIT + 64 * 4096, "the server took far more than the limit"
    except (trio.BrokenResourceError, ConnectionResetError, BrokenPipeError, OSError):
        pass


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_misbehaving_client_costs_the_others_nothing(fault_server, nursery, protocol, phase, behaviour):
    if protocol == "moshi" and phase == "connected":
        phase = "preparing"  # a Moshi conversation is admitted from its query at once: there is no wait to misbehave in
    server = await fault_server()
    port = server.port
    witness = await start_witness(nursery, server)
    blocker_done = trio.Event()
    if phase == "queued":  # both slots taken: the bad client waits in the queue
        nursery.start_soon(_blocker, server.handle.ws_url, blocker_done)
        with trio.fail_after(10):
            while (await get(port, "/health"))["slots_free"]:
                await trio.sleep(0.02)
    before = max((s["id"] for s in (await get(port, "/api/sessions"))["sessions"]), default=0)
    bad = await BadClient.connect(port, PATHS[protocol], rcvbuf=4096 if behaviour == "stop_reading" else None)
    await bring_to(phase, protocol, bad, port, before)
    await misbehave(behaviour, bad)

    with trio.fail_after(GONE_WITHIN):
        while await newest_session(port, before) is not None:
            await trio.sleep(0.05)
    blocker_done.set()
    await witness_talks_on_then_ends(witness, partial(get, port, "/health"))
    health = await drained(port)
    assert health["status"] == "ok" and health["slots_free"] == 2 and health["queued"] == 0
    bad.close()


async def _blocker(base: str, done: trio.Event) -> None:
    """A well-behaved conversation that holds a slot until told to leave."""
    async with open_websocket(base + "/v1/audio/duplex") as ws:
        await raw_open(ws)
        with trio.move_on_after(60):
            async with trio.open_nursery() as nursery:
                async def read():
                    while True:
                        await ws.get_message()
                nursery.start_soon(read)
                await done.wait()
                nursery.cancel_scope.cancel()


@pytest.mark.parametrize("behaviour", ["stop_reading", "freeze", "fragments"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_shutdown_finishes_within_5_s_whatever_the_clients_do(fault_server, nursery, protocol, behaviour):
    server = await fault_server(shutdown_grace=1.0, client_timeout=30)  # the timeout cannot help here
    port = server.port
    polite = await BadClient.connect(port, PATHS["raw"])  # well-behaved: it reads, to see its 1001
    await polite.send(OPEN)
    bad = await BadClient.connect(port, PATHS[protocol], rcvbuf=4096)
    await bring_to("live", protocol, bad, port, 0)
    if behaviour == "fragments":
        await bad.send_raw(masked_frame(b"x" * 1024, opcode=0x2, fin=False))
    await trio.sleep(1.0)  # the bad client's buffers fill
    started = trio.current_time()
    nursery.start_soon(server.handle.shutdown)
    code, _ = await polite.read_until_closed(timeout=5)
    assert code == 1001  # told why, when it could be
    with trio.fail_after(5 - (trio.current_time() - started)):
        await server.stopped.wait()
    polite.close()
    bad.close()


@pytest.mark.parametrize("behaviour", ["stop_reading", "freeze", "reset", "fragments"])
async def test_a_drain_is_not_held_by_a_misbehaving_client(fault_server, nursery, behaviour):
    """SIGTERM's drain with a bad live client beside the witness: the bad one goes, the witness goes on."""
    server = await fault_server(drain_seconds=60, refuse_busy_upgrades=True)
    port = server.port
    witness = await start_witness(nursery, server)
    before = max(s["id"] for s in (await get(port, "/api/sessions"))["sessions"])
    bad = await BadClient.connect(port, PATHS["raw"], rcvbuf=4096 if behaviour == "stop_reading" else None)
    await bring_to("live", "raw", bad, port, before)
    nursery.start_soon(server.handle.drain_then_shutdown, 60)
    await misbehave(behaviour, bad)
    with trio.fail_after(GONE_WITHIN):  # the client timeout ends it, as when not draining
        while await newest_session(port, before) is not None:
            await trio.sleep(0.05)
    assert (await get(port, "/ready"))["reason"] == "draining"
    await trio.sleep(0.6)  # the witness goes on talking
    witness.stop.set()
    with trio.fail_after(5):  # the last conversation is over: so is the drain, far short of its 60 s
        await server.stopped.wait()
    witness.check()
    bad.close()


async def test_half_sent_http_requests_time_out_and_others_are_served(fault_server):
    server = await fault_server()
    port = server.port
    streams = []
    for half in (b"GET /api/chat HTTP/1.1\r\nHost: x\r\n", b"GET /he", b"G"):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(half)
        streams.append(stream)
    assert (await get(port, "/health"))["status"] == "ok"  # served meanwhile
    with trio.fail_after(CLIENT_TIMEOUT + 2):
        for stream in streams:
            while await stream.receive_some(1024):
                pass  # the server closes it: EOF
    for stream in streams:
        await stream.aclose()


async def test_a_request_head_over_16_kib_is_refused_with_431(fault_server):
    server = await fault_server()
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"GET /health?" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    with trio.fail_after(3):
        answer = await stream.receive_some(1024)
    assert answer.startswith(b"HTTP/1.1 431")
    await stream.aclose()
    assert (await get(server.port, "/health"))["status"] == "ok"


async def test_data_before_the_upgrade_is_answered_is_refused(fault_server):
    server = await fault_server()
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    request = (b"GET /v1/audio/duplex HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    await stream.send_all(request + masked_frame(b"{}", opcode=0x1, fin=True))
    with trio.fail_after(3):
        answer = await stream.receive_some(1024)
    assert answer.startswith(b"HTTP/1.1 400")
    await stream.aclose()


async def test_compression_is_never_negotiated(fault_server):
    server = await fault_server()
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(
        b"GET /v1/audio/duplex HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n")
    with trio.fail_after(3):
        answer = await stream.receive_some(4096)
    assert answer.startswith(b"HTTP/1.1 101") and b"permessage-deflate" not in answer.lower()
    await stream.aclose()


async def test_a_storm_of_connections_that_reset_leaves_nothing_behind(fault_server, nursery):
    server = await fault_server()
    port = server.port
    witness = await start_witness(nursery, server)

    async def one(i: int) -> None:
        bad = await BadClient.connect(port, PATHS["raw" if i % 2 else "moshi"])
        try:
            if i % 3 == 0:
                await bad.send(OPEN)
        finally:
            bad.reset()

    for _ in range(10):  # 200 connections, 20 at a time
        async with trio.open_nursery() as storm:
            for i in range(20):
                storm.start_soon(one, i)
    with trio.fail_after(10):
        while len((await get(port, "/api/sessions"))["sessions"]) > 1:
            await trio.sleep(0.05)
    await witness_talks_on_then_ends(witness, partial(get, port, "/health"))
    health = await drained(port)
    assert health["status"] == "ok" and health["slots_free"] == 2 and health["queued"] == 0


async def test_sigterm_with_a_frozen_and_a_non_reading_client_exits_within_5_s():
    """The real command: `pplex-trio serve`, two bad clients, SIGTERM, exit 0 within 5 s."""
    import signal

    from _helpers.process import start_serve

    proc, port, _ = start_serve("--model", "echo:prompt=2", "--slots", "2")
    try:
        clients = []
        for protocol, rcvbuf in (("raw", 4096), ("moshi", None)):
            client = await BadClient.connect(port, PATHS[protocol], rcvbuf=rcvbuf)
            await bring_to("live", protocol, client, port, 0)
            clients.append(client)  # from now on neither reads
        await trio.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        started = trio.current_time()
        code = await trio.to_thread.run_sync(proc.wait, 10)
        assert code == 0 and trio.current_time() - started < 5
        for client in clients:
            client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
