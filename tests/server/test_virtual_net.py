"""The virtual network (``tests/_helpers/virtual_net.py``) against real loopback TCP: same scenario, same outcome.

The server tests run on the virtual network, so each behaviour of TCP the
server relies on is played here on both: a real loopback connection (small
buffers; the real clock, since the kernel's delivery takes real time) and a
virtual one (the virtual clock).  ``server`` is the end the server would hold,
``client`` the other.
"""

from __future__ import annotations

import json
import socket
import struct

import numpy as np
import pytest
import trio
import trio.testing

from _helpers.virtual_net import VirtualNetwork
from _helpers.ws import FRAME, raw_open, read_until_closed

BUFFER = 4096


@pytest.fixture(params=["real", "virtual"])
def kind(request) -> str:
    return request.param


@pytest.fixture
def clock(kind):
    """The virtual network runs on the virtual clock; real sockets on the real one."""
    return trio.testing.MockClock(autojump_threshold=0) if kind == "virtual" else None


@pytest.fixture
async def connected(kind):
    """``await connected()`` → (server's end, client's end) of a new connection with small buffers towards the
    client."""
    opened: list[trio.abc.Stream] = []

    async def connect() -> tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]:
        if kind == "virtual":
            network = VirtualNetwork(buffer=BUFFER)
            listener = network.listen("127.0.0.1", 8998)
            client = await network.connect("127.0.0.1", 8998)
            server = await listener.accept()
        else:
            with socket.create_server(("127.0.0.1", 0)) as listener:
                theirs = socket.socket()
                theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)  # before connecting, as BadClient
                theirs.connect(listener.getsockname())
                ours, _ = listener.accept()
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
            server = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
            client = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
        opened.extend((server, client))
        return server, client

    yield connect
    for stream in opened:
        await trio.aclose_forcefully(stream)


def abort(stream) -> None:
    """What the transport's GuardedStream.abort does: SO_LINGER 0, then close the socket."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


async def read_all(stream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(65536)
        assert chunk, "EOF before the whole message"
        data += chunk
    return bytes(data)


async def test_bytes_arrive_in_order_and_a_half_close_is_an_end_of_stream(kind, clock, connected):
    server, client = await connected()
    await server.send_all(b"hello, ")
    await server.send_all(b"world")
    await server.send_eof()
    assert await read_all(client, 12) == b"hello, world"
    assert await client.receive_some(100) == b""  # and again: the end stays the end
    assert await client.receive_some(100) == b""
    await client.send_all(b"still open this way")  # a half-close closes one direction only
    assert await read_all(server, 19) == b"still open this way"
    with pytest.raises(trio.ClosedResourceError):
        await server.send_all(b"after the end")
    await server.aclose()
    await client.aclose()


async def test_a_client_that_stops_reading_blocks_the_writer_once_the_buffers_are_full(kind, clock, connected):
    server, client = await connected()
    message = bytes(range(256)) * 4096  # 1 MiB: far more than the buffers hold
    with trio.move_on_after(0.5) as blocked:
        await server.send_all(message)
    assert blocked.cancelled_caught  # the write waits on the client
    server, client = await connected()  # (a cancelled write leaves its stream broken: a new one)
    received = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.send_all, message)
        await trio.sleep(0.2)  # the writer blocks ...
        received.append(await read_all(client, len(message)))  # ... until the client reads on
    assert received == [message]


async def test_an_abort_breaks_both_ends_at_once(kind, clock, connected):
    server, client = await connected()
    await client.send_all(b"unread")
    await server.send_all(b"last words")  # (a refusal's close frame, written just before the abort)
    woken = []

    async def blocked_read() -> None:  # the server's own reader, waiting when the abort comes
        await server.receive_some(100)
        try:
            await server.receive_some(100)
        except trio.ClosedResourceError:
            woken.append("closed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocked_read)
        await trio.testing.wait_all_tasks_blocked() if kind == "virtual" else await trio.sleep(0.1)
        abort(server)
    assert woken == ["closed"]
    await trio.sleep(0.05)  # (the reset crosses the loopback)
    assert await client.receive_some(100) == b"last words"  # what had reached the client is read first ...
    with pytest.raises(trio.BrokenResourceError):
        await client.receive_some(100)  # ... then the reset
    with pytest.raises(OSError):
        client.socket.getpeername()  # no peer any more
    with pytest.raises(trio.BrokenResourceError):
        await client.send_all(b"anyone there?")


async def test_closing_with_bytes_unread_resets_the_connection(kind, clock, connected):
    server, client = await connected()
    await client.send_all(b"audio the server never read")
    await trio.sleep(0.05)
    await server.aclose()
    await trio.sleep(0.05)
    with pytest.raises(trio.BrokenResourceError):
        await client.receive_some(100)


async def test_a_peer_that_closed_reads_as_the_end_and_writing_to_it_fails(kind, clock, connected):
    server, client = await connected()
    await client.send_all(b"bye")
    await client.aclose()
    assert await read_all(server, 3) == b"bye"
    assert await server.receive_some(100) == b""
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(2):  # the kernel takes the first write and answers it with a reset; the second fails
            await server.send_all(b"are you there?")
            await trio.sleep(0.05)


async def test_addresses_and_a_refused_connection(kind, clock, connected):
    server, client = await connected()
    assert server.socket.family == socket.AF_INET
    assert server.socket.getpeername() == client.socket.getsockname()
    assert server.socket.getsockname() == client.socket.getpeername()
    server.socket.close()
    with pytest.raises(OSError):
        server.socket.getpeername()  # closed: as a socket whose descriptor is gone
    if kind == "virtual":
        with pytest.raises(ConnectionRefusedError):
            await VirtualNetwork().connect("127.0.0.1", 8998)
    else:
        with socket.create_server(("127.0.0.1", 0)) as unused:
            port = unused.getsockname()[1]
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)
    await client.aclose()


# -- the real server on it ---------------------------------------------------------------


async def test_the_real_server_serves_on_the_virtual_network(virtual_server, autojump_clock):
    """``serve`` over a virtual listener: its handle names the listener's address, and HTTP and a conversation
    go through (``virtual_server``: tests/_helpers/virtual_server.py)."""
    vs = await virtual_server(slots=1)
    assert vs.handle.binds == ["http://127.0.0.1:8998"] and vs.port == 8998
    assert (vs.http_url, vs.ws_url) == ("http://127.0.0.1:8998", "ws://127.0.0.1:8998")
    health = await vs.get_json("/health")
    assert (health["status"], health["slots_free"]) == ("ok", 1)
    frame = np.linspace(-0.5, 0.5, FRAME, dtype=np.float32)
    async with vs.open_websocket("/v1/audio/duplex") as ws:
        await raw_open(ws)
        for pcm in (frame, np.zeros(FRAME, np.float32)):  # the echo's one frame of delay, then the frame
            await ws.send_message(pcm.tobytes())
        await ws.send_message(json.dumps({"type": "close"}))
        closed = await read_until_closed(ws)
    audio = [np.frombuffer(m, "<f4") for m in closed.messages if isinstance(m, bytes)]
    assert closed.code == 1000 and any(np.array_equal(a, frame) for a in audio)
    await vs.shutdown()
    with trio.fail_after(5):
        await vs.stopped.wait()
    with pytest.raises(ConnectionRefusedError):  # its listener is closed
        await vs.connect()
