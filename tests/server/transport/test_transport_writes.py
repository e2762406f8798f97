"""The guarded transport's write and read deadlines: one watchdog, no cancel scope per write or read.

On the virtual network (whose bounded buffers fill as a kernel's do, checked
against loopback in ``test_virtual_net.py``) and the virtual clock, so every
deadline is checked exactly: a client end that never reads, so a write blocks,
and one that reads.
"""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from _helpers.virtual_net import VirtualNetwork, VirtualStream
from pplex_trio.server.transport._guarded_stream import GuardedStream
from pplex_trio.server.transport._transport import WATCH_INTERVAL, Connections, _watch_deadlines

WRITE_TIMEOUT = 3.0


async def guarded_pair(
    write_timeout: float = WRITE_TIMEOUT, *, read_timeout: float = math.inf, buffer: int = 4096
) -> tuple[GuardedStream, VirtualStream]:
    """Our end of a connection, guarded, and the client's end; ``buffer`` bytes each way."""
    network = VirtualNetwork(buffer=buffer)
    listener = network.listen("127.0.0.1", 8998)
    theirs = await network.connect("127.0.0.1", 8998)
    ours = await listener.accept()
    return GuardedStream(
        ours, write_timeout=write_timeout, read_timeout=read_timeout, max_message_bytes=1 << 20
    ), theirs


async def test_a_write_the_client_never_reads_is_aborted_at_its_deadline(autojump_clock):
    guarded, theirs = await guarded_pair()
    connections = Connections()
    connections.open.add(guarded)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_deadlines, connections, WRITE_TIMEOUT)
        started = trio.current_time()
        with trio.fail_after(60), pytest.raises(trio.BrokenResourceError, match="read nothing for 3 s"):
            await guarded.send_all(bytes(1 << 22))  # far more than the buffers hold (no watchdog: TooSlowError)
        waited = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert WRITE_TIMEOUT <= waited <= WRITE_TIMEOUT + WATCH_INTERVAL + 1e-6
    assert guarded.aborted and guarded.write_started is None
    with pytest.raises(trio.BrokenResourceError):  # the abort was a reset: the client sees it too
        while True:
            await theirs.receive_some(65536)
    await guarded.aclose()
    await theirs.aclose()


async def test_writes_that_complete_and_idle_connections_are_left_alone(autojump_clock):
    timeout = 0.3
    guarded, theirs = await guarded_pair(timeout, buffer=16_384)
    connections = Connections()
    connections.open.add(guarded)
    received = bytearray()

    async def read() -> None:  # a slow reader: each write waits on it, but never for as long as the deadline
        while len(received) < 400_000:
            await trio.sleep(timeout / 10)
            received.extend(await theirs.receive_some(65536))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_deadlines, connections, timeout)
        nursery.start_soon(read)
        for _ in range(40):
            await guarded.send_all(bytes(10_000))
        await trio.sleep(3 * timeout)  # idle: no write in progress, nothing to enforce
        nursery.cancel_scope.cancel()
    assert len(received) == 400_000 and not guarded.aborted
    await guarded.aclose()
    await theirs.aclose()


READ_TIMEOUT = 4.0
REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"  # (the guard passes on whole request heads)


async def test_a_client_that_sends_nothing_is_aborted_at_the_read_deadline(autojump_clock):
    """hypercorn's pings give a live client something to answer; one silent for the read timeout (dead, frozen,
    half-open) is dropped, whether or not it ever sent anything, and a read waiting on it wakes."""
    guarded, theirs = await guarded_pair(read_timeout=READ_TIMEOUT)
    connections = Connections()
    connections.open.add(guarded)
    await theirs.send_all(REQUEST)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_deadlines, connections, READ_TIMEOUT)
        assert await guarded.receive_some(1024) == REQUEST
        last = trio.current_time()
        with trio.fail_after(60), pytest.raises((trio.ClosedResourceError, trio.BrokenResourceError)):
            await guarded.receive_some(1024)
        waited = trio.current_time() - last
        nursery.cancel_scope.cancel()
    assert READ_TIMEOUT <= waited <= READ_TIMEOUT + WATCH_INTERVAL + 1e-6
    assert guarded.aborted and not guarded.write_timed_out
    await theirs.aclose()

    silent, theirs = await guarded_pair(read_timeout=READ_TIMEOUT)  # never sends a byte
    connections.open = {silent}
    with trio.move_on_after(READ_TIMEOUT + WATCH_INTERVAL + 0.01):
        await _watch_deadlines(connections, READ_TIMEOUT)
    assert silent.aborted
    await theirs.aclose()


async def test_a_client_that_keeps_sending_is_left_alone(autojump_clock):
    guarded, theirs = await guarded_pair(read_timeout=READ_TIMEOUT)
    connections = Connections()
    connections.open.add(guarded)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_deadlines, connections, READ_TIMEOUT)
        for _ in range(10):  # 30 s in all, never more than 3 s apart (as a pong now and then)
            await trio.sleep(READ_TIMEOUT - 1)
            await theirs.send_all(REQUEST)
            assert await guarded.receive_some(1024) == REQUEST
        nursery.cancel_scope.cancel()
    assert not guarded.aborted
    await guarded.aclose()
    await theirs.aclose()


async def test_a_write_waits_for_a_refusal_being_written(autojump_clock):
    # The lock keeps our own refusal (written from the reading side) and hypercorn's writes apart.
    guarded, theirs = await guarded_pair()
    order: list[str] = []
    async with trio.open_nursery() as nursery:
        await guarded._lock.acquire()

        async def write() -> None:
            await guarded.send_all(b"after")
            order.append("write")

        nursery.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()
        order.append("refusal done")
        guarded._lock.release()
    assert order == ["refusal done", "write"]
    assert await theirs.receive_some(16) == b"after"
    await guarded.aclose()
    await theirs.aclose()


async def test_a_close_while_an_answer_is_being_written_waits_for_it(autojump_clock):
    """hypercorn closes (``send_eof``) outside its own send lock: a close that came while a write was blocked
    on the client collided with it (``trio.BusyResourceError`` in the log, the answer cut).  The close now
    waits for the write, and the client gets the whole answer, then the end of the stream."""
    guarded, theirs = await guarded_pair()
    answer = bytes(range(256)) * 384  # 96 KiB: more than the small buffers hold, so the write blocks
    received = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(guarded.send_all, answer)
        await trio.testing.wait_all_tasks_blocked()
        assert guarded.write_started is not None  # the write is blocked on the client
        nursery.start_soon(guarded.send_eof)
        await trio.testing.wait_all_tasks_blocked()  # (before: BusyResourceError here)
        with trio.fail_after(10):  # the client reads at last
            while chunk := await theirs.receive_some(65536):
                received += chunk
    assert bytes(received) == answer  # all of it, then EOF
    await guarded.aclose()
    await theirs.aclose()
