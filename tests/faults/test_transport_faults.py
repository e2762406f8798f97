"""Clients that misbehave at the transport level, at every phase of a session, on every protocol.

Each case runs beside a *witness*: a raw conversation that streams known audio
the whole time and must get every frame back, exactly.  A bad client is
brought to a phase (connected, queued, preparing, live, closing) and then
misbehaves: it stops reading (with a small receive buffer), freezes, resets
the connection (SO_LINGER 0), sends fragments forever, or sends a frame
header claiming a gigabyte and nothing more.  Every case must end with the bad
session gone within the client timeout (plus the second the transport allows
a write), every slot free and the server answering.

The matrix runs on the virtual network and clock (``tests/_helpers/
virtual_net.py``): the real server, its connections in memory with bounded
buffers, so a client that stops reading fills them, a frozen one sends
nothing and a reset breaks both ends, and every deadline is exact whatever the
machine's load.  A sample runs on real loopback sockets and the real clock as
well (``serial``: their witnesses need the CPU): each behaviour once, live,
on the protocols in turn.  The behaviours are the transport's (the
kernel's buffers, resets, silences), the phases and protocols the session
core's, which the virtual matrix covers; the sample shows that the virtual
network is the kernel's TCP as far as the server can tell.  The real command
(``pplex-trio serve``) with two bad clients and a SIGTERM stays on real sockets
too: signals and the encoder child are the point there.
"""

from __future__ import annotations

import base64
import contextlib
import json

import numpy as np
import pytest
import trio

from _helpers.bad_client import CLIENT_TIMEOUT, LIMIT, BadClient, frame_header, masked_frame
from _helpers.ws import RawWitness, raw_open
from pplex_trio._conversation import CLOSE_BUDGET
from pplex_trio.server.transport._transport import WATCH_INTERVAL

PATHS = {
    "raw": "/v1/audio/duplex",
    "moshi": "/api/chat?voice_prompt=NATF0.pt",
    "realtime": "/v1/realtime",
    "live": "/v1/live/sessions",
    "twilio": "/telephony/twilio",
    "telnyx": "/telephony/telnyx",
    "plivo": "/telephony/plivo",
    "exotel": "/telephony/exotel",
}
OPEN = json.dumps({"type": "open"})
APPEND = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(3840)).decode()})
START = json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}})
TWILIO_OPEN = [
    json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
    json.dumps(
        {
            "event": "start",
            "sequenceNumber": "1",
            "streamSid": "MZ1",
            "start": {
                "streamSid": "MZ1",
                "callSid": "CA1",
                "accountSid": "AC1",
                "tracks": ["inbound"],
                "customParameters": {},
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            },
        }
    ),
]
TWILIO_MEDIA = json.dumps(
    {
        "event": "media",
        "streamSid": "MZ1",
        "media": {"track": "inbound", "payload": base64.b64encode(b"\xff" * 160).decode()},
    }
)
TELNYX_OPEN = [
    json.dumps({"event": "connected", "version": "1.0.0"}),
    json.dumps(
        {
            "event": "start",
            "sequence_number": "1",
            "stream_id": "S1",
            "start": {
                "user_id": "U1",
                "call_control_id": "v3:C1",
                "custom_parameters": {},
                "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
            },
        }
    ),
]
TELNYX_MEDIA = json.dumps(
    {
        "event": "media",
        "stream_id": "S1",
        "media": {"track": "inbound", "payload": base64.b64encode(b"\xff" * 160).decode()},
    }
)
PLIVO_OPEN = [
    json.dumps(
        {
            "event": "start",
            "sequenceNumber": 0,
            "start": {
                "callId": "C1",
                "streamId": "S1",
                "accountId": "A1",
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
            },
            "extra_headers": "{}",
        }
    )
]
PLIVO_MEDIA = json.dumps(
    {
        "event": "media",
        "streamId": "S1",
        "media": {"track": "inbound", "payload": base64.b64encode(b"\xff" * 160).decode()},
    }
)
EXOTEL_OPEN = [
    json.dumps({"event": "connected"}),
    json.dumps(
        {
            "event": "start",
            "sequence_number": "1",
            "stream_sid": "S1",
            "start": {
                "stream_sid": "S1",
                "call_sid": "C1",
                "account_sid": "A1",
                "custom_parameters": {},
                "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"},
            },
        }
    ),
]
EXOTEL_MEDIA = json.dumps(
    {"event": "media", "stream_sid": "S1", "media": {"chunk": "1", "payload": base64.b64encode(bytes(1600)).decode()}}
)
# What opens a carrier's stream, and a media event of the caller's (a call says nothing until it hears something).
CARRIER_OPEN = {
    "twilio": (TWILIO_OPEN, TWILIO_MEDIA),
    "telnyx": (TELNYX_OPEN, TELNYX_MEDIA),
    "plivo": (PLIVO_OPEN, PLIVO_MEDIA),
    "exotel": (EXOTEL_OPEN, EXOTEL_MEDIA),
}
PROTOCOLS = ["raw", "moshi", "realtime", "live", "twilio", "telnyx", "plivo", "exotel"]
PHASES = ["connected", "queued", "preparing", "live", "closing"]
BEHAVIOURS = ["stop_reading", "freeze", "reset", "fragments", "header_only"]
POLL = 0.05  # how often the tests look (a session that ends at once may still be unwinding at the first look)
# How long after it misbehaves a bad client's session is gone, on the virtual clock: a reset, and a message over
# the limit, are seen at once; a silent client is aborted at the read deadline (since its last byte, checked
# every WATCH_INTERVAL); a write it never reads at the session's send deadline, or at worst at the transport's,
# a second later.
GONE_WITHIN = {
    "reset": 0.0,
    "fragments": 0.0,
    "header_only": 0.0,
    "freeze": CLIENT_TIMEOUT + WATCH_INTERVAL,
    "stop_reading": CLIENT_TIMEOUT + 1 + WATCH_INTERVAL,
}


def gone_within(phase: str, behaviour: str) -> float:
    """GONE_WITHIN, but a session already closing has its close's own budget: a reset that meets the close's
    first write can go unseen until then (hypercorn drops the disconnect when the write that met the reset was
    made by a task being cancelled: the session's send task, as its session ends)."""
    return max(GONE_WITHIN[behaviour], CLOSE_BUDGET) if phase == "closing" else GONE_WITHIN[behaviour]


REAL_GONE_WITHIN = CLIENT_TIMEOUT + 1 + 2.5  # on the real clock: the close budget, and slack for a loaded machine
REAL_SAMPLE = list(zip(["raw", "moshi", "realtime", "raw", "moshi"], BEHAVIOURS))  # (protocol, behaviour), live


async def drained(server) -> dict:
    """/health once the last slot has drained (a slot is freed at the tick after its session ends)."""
    with trio.move_on_after(2):
        while (health := await server.get_json("/health"))["slots_free"] != 2:
            await trio.sleep(0.02)
    return health


async def newest_session(server, after: int) -> dict | None:
    sessions = [s for s in (await server.get_json("/api/sessions"))["sessions"] if s["id"] > after]
    return sessions[-1] if sessions else None


async def wait_for_state(server, after: int, state: str) -> None:
    with trio.fail_after(10):
        while (session := await newest_session(server, after)) is None or session["state"] != state:
            await trio.sleep(0.02)


async def start_witness(nursery, server, **options) -> RawWitness:
    """A raw conversation streaming known audio beside the bad client; check it at the end."""
    witness = server.witness(**options)
    nursery.start_soon(witness.run)
    with trio.fail_after(10):
        await witness.ready.wait()
    return witness


async def witness_talks_on_then_ends(witness: RawWitness, server) -> None:
    """After the bad client is gone the witness goes on talking a while, then ends; it lost nothing."""
    await trio.sleep(0.6)
    witness.stop.set()
    with trio.fail_after(10):
        while (await server.get_json("/health"))["sessions"]:
            await trio.sleep(0.05)
    witness.check()


async def bring_to(phase: str, protocol: str, bad: BadClient, server, after: int) -> None:
    """Take the bad client's conversation to ``phase``, behaving well on the way."""
    if phase == "connected":
        return
    if protocol == "raw":
        await bad.send(OPEN)
    if protocol == "realtime":
        await bad.send(APPEND)  # the first audio starts the conversation
    if protocol == "live":
        await bad.send(START)
    if protocol in CARRIER_OPEN:
        for message in CARRIER_OPEN[protocol][0]:
            await bad.send(message)
    if phase in ("queued", "preparing"):
        await wait_for_state(server, after, phase)
        return
    with trio.fail_after(10):
        if protocol in CARRIER_OPEN:  # a call says nothing when it is live: its first media out shows it
            await bad.send(CARRIER_OPEN[protocol][1])
        while True:
            message = await bad.receive()
            if message == b"\x00" or (
                isinstance(message, str)
                and (
                    json.loads(message).get("type") in ("ready", "response.created", "session.started")
                    or json.loads(message).get("event") in ("media", "playAudio")
                )
            ):
                break
    if phase == "closing":
        if protocol == "raw":
            await bad.send(np.zeros(1920 * 3, "<f4").tobytes())
            await bad.send(json.dumps({"type": "close"}))  # the flush is still running when it misbehaves
        elif protocol in ("realtime", "live", *CARRIER_OPEN):
            await bad.send(b"binary frames are refused")  # the server starts closing (1003)
        else:
            await bad.send("text frames are refused")  # the server starts closing (1003)


async def misbehave(behaviour: str, bad: BadClient) -> None:
    if behaviour == "stop_reading":
        return  # from now on it reads nothing (its small receive buffer fills)
    if behaviour == "freeze":
        bad.freeze()  # from now on it reads and sends nothing
        return
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


async def a_misbehaving_client_costs_the_others_nothing(
    server, nursery, protocol: str, phase: str, behaviour: str, gone_within: float
) -> None:
    witness = await start_witness(nursery, server)
    blocker_done = trio.Event()
    if phase == "queued":  # both slots taken: the bad client waits in the queue
        nursery.start_soon(_blocker, server, blocker_done)
        with trio.fail_after(10):
            while (await server.get_json("/health"))["slots_free"]:
                await trio.sleep(0.02)
    before = max((s["id"] for s in (await server.get_json("/api/sessions"))["sessions"]), default=0)
    bad = await server.bad_client(PATHS[protocol], receive_buffer=4096 if behaviour == "stop_reading" else None)
    await bring_to(phase, protocol, bad, server, before)
    await misbehave(behaviour, bad)
    with trio.fail_after(gone_within + 2 * POLL):
        while await newest_session(server, before) is not None:
            await trio.sleep(POLL)
    blocker_done.set()
    await witness_talks_on_then_ends(witness, server)
    health = await drained(server)
    assert health["status"] == "ok" and health["slots_free"] == 2 and health["queued"] == 0
    bad.close()


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_misbehaving_client_costs_the_others_nothing(
    fault_server, autojump_clock, nursery, protocol, phase, behaviour
):
    if protocol == "moshi" and phase == "connected":
        phase = "preparing"  # a Moshi conversation is admitted from its query at once: there is no wait to misbehave in
    await a_misbehaving_client_costs_the_others_nothing(
        await fault_server(), nursery, protocol, phase, behaviour, gone_within(phase, behaviour)
    )


@pytest.mark.serial
@pytest.mark.parametrize("protocol, behaviour", REAL_SAMPLE)
async def test_on_real_sockets_a_misbehaving_client_costs_the_others_nothing(
    real_fault_server, nursery, protocol, behaviour
):
    await a_misbehaving_client_costs_the_others_nothing(
        await real_fault_server(), nursery, protocol, "live", behaviour, REAL_GONE_WITHIN
    )


async def _blocker(server, done: trio.Event) -> None:
    """A well-behaved conversation that holds a slot until told to leave."""
    async with server.open_websocket("/v1/audio/duplex") as ws:
        await raw_open(ws)
        with trio.move_on_after(60):
            async with trio.open_nursery() as nursery:

                async def read():
                    while True:
                        await ws.get_message()

                nursery.start_soon(read)
                await done.wait()
                nursery.cancel_scope.cancel()


SHUTDOWN_GRACE = 1.0


@pytest.mark.parametrize("behaviour", ["stop_reading", "freeze", "fragments"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_shutdown_is_bounded_whatever_the_clients_do(fault_server, autojump_clock, nursery, protocol, behaviour):
    """Shutdown takes at most the grace for the conversations to close, the grace again for the connections,
    then aborts what a write still holds (docs/ARCHITECTURE.md, *Faults*)."""
    server = await fault_server(shutdown_grace=SHUTDOWN_GRACE, client_timeout=30)  # the timeout cannot help here
    polite = await server.bad_client(PATHS["raw"])  # well-behaved: it reads, to see its 1001
    await polite.send(OPEN)
    bad = await server.bad_client(PATHS[protocol], receive_buffer=4096)
    await bring_to("live", protocol, bad, server, 0)
    if behaviour == "fragments":
        await bad.send_raw(masked_frame(b"x" * 1024, opcode=0x2, fin=False))
    if behaviour == "freeze":
        bad.freeze()
    await trio.sleep(1.0)  # the bad client's buffers fill
    started = trio.current_time()
    nursery.start_soon(server.handle.shutdown)
    code, _ = await polite.read_until_closed(timeout=5)
    assert code == 1001  # told why, when it could be
    with trio.fail_after(started + 2 * SHUTDOWN_GRACE + 0.1 - trio.current_time()):
        await server.stopped.wait()
    polite.close()
    bad.close()


@pytest.mark.parametrize("behaviour", ["stop_reading", "freeze", "reset", "fragments"])
async def test_a_drain_is_not_held_by_a_misbehaving_client(fault_server, autojump_clock, nursery, behaviour):
    """SIGTERM's drain with a bad live client beside the witness: the bad one goes, the witness goes on."""
    server = await fault_server(drain_seconds=60, refuse_busy_upgrades=True)
    witness = await start_witness(nursery, server)
    before = max(s["id"] for s in (await server.get_json("/api/sessions"))["sessions"])
    bad = await server.bad_client(PATHS["raw"], receive_buffer=4096 if behaviour == "stop_reading" else None)
    await bring_to("live", "raw", bad, server, before)
    nursery.start_soon(server.handle.drain_then_shutdown, 60)
    await misbehave(behaviour, bad)
    with trio.fail_after(GONE_WITHIN[behaviour] + 2 * POLL):  # as when not draining
        while await newest_session(server, before) is not None:
            await trio.sleep(POLL)
    assert (await server.get("/ready")).json()["reason"] == "draining"
    await trio.sleep(0.6)  # the witness goes on talking
    witness.stop.set()
    with trio.fail_after(5):  # the last conversation is over: so is the drain, far short of its 60 s
        await server.stopped.wait()
    witness.check()
    bad.close()


async def test_half_sent_http_requests_time_out_and_others_are_served(fault_server, autojump_clock):
    server = await fault_server()
    streams = []
    sent = trio.current_time()
    for half in (b"GET /api/chat HTTP/1.1\r\nHost: x\r\n", b"GET /he", b"G"):
        stream = await server.connect()
        await stream.send_all(half)
        streams.append(stream)
    assert (await server.get_json("/health"))["status"] == "ok"  # served meanwhile
    for stream in streams:
        with contextlib.suppress(trio.BrokenResourceError):  # closed (EOF) or aborted (a reset): ended either way
            while await stream.receive_some(1024):
                pass
    # hypercorn's keep-alive timeout and the transport's read deadline are both the client timeout
    assert CLIENT_TIMEOUT <= trio.current_time() - sent <= CLIENT_TIMEOUT + WATCH_INTERVAL
    for stream in streams:
        await stream.aclose()


async def test_a_request_head_over_16_kib_is_refused_with_431(fault_server, autojump_clock):
    server = await fault_server()
    stream = await server.connect()
    await stream.send_all(b"GET /health?" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    with trio.fail_after(3):
        answer = await stream.receive_some(1024)
    assert answer.startswith(b"HTTP/1.1 431")
    await stream.aclose()
    assert (await server.get_json("/health"))["status"] == "ok"


async def test_data_before_the_upgrade_is_answered_is_refused(fault_server, autojump_clock):
    server = await fault_server()
    stream = await server.connect()
    request = (
        b"GET /v1/audio/duplex HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await stream.send_all(request + masked_frame(b"{}", opcode=0x1, fin=True))
    with trio.fail_after(3):
        answer = await stream.receive_some(1024)
    assert answer.startswith(b"HTTP/1.1 400")
    await stream.aclose()


async def test_compression_is_never_negotiated(fault_server, autojump_clock):
    server = await fault_server()
    stream = await server.connect()
    await stream.send_all(
        b"GET /v1/audio/duplex HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n"
    )
    with trio.fail_after(3):
        answer = await stream.receive_some(4096)
    assert answer.startswith(b"HTTP/1.1 101") and b"permessage-deflate" not in answer.lower()
    await stream.aclose()


async def test_a_storm_of_connections_that_reset_leaves_nothing_behind(fault_server, autojump_clock, nursery):
    server = await fault_server()
    witness = await start_witness(nursery, server)

    async def one(i: int) -> None:
        bad = await server.bad_client(PATHS["raw" if i % 2 else "moshi"])
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
        while len((await server.get_json("/api/sessions"))["sessions"]) > 1:
            await trio.sleep(0.05)
    await witness_talks_on_then_ends(witness, server)
    health = await drained(server)
    assert health["status"] == "ok" and health["slots_free"] == 2 and health["queued"] == 0


@pytest.mark.serial
async def test_sigterm_with_a_frozen_and_a_non_reading_client_exits_within_5_s():
    """The real command: `pplex-trio serve`, two bad clients, SIGTERM, exit 0 within 5 s."""
    import signal

    from _helpers.process import start_serve

    proc, port, _ = start_serve("--model", "echo:prompt=2", "--slots", "2")
    try:
        clients = []
        for protocol, rcvbuf in (("raw", 4096), ("moshi", None)):
            client = await BadClient.connect(port, PATHS[protocol], rcvbuf=rcvbuf)
            await bring_to("live", protocol, client, _Port(port), 0)
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


class _Port:
    """A server known by its port alone (the real command's): what ``bring_to`` asks of it."""

    def __init__(self, port: int):
        self.port = port

    async def get_json(self, path: str):
        import httpx

        async with httpx.AsyncClient() as http:
            return (await http.get(f"http://127.0.0.1:{self.port}{path}", timeout=5)).json()
