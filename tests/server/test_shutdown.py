"""Graceful shutdown: every open conversation is closed with 1001 within 1 s.

The server's own shutdown on the virtual network and clock; the real command's
signals (SIGTERM, a terminal's Ctrl-C to the process group with its encoder
child) over real sockets.
"""

import os
import signal

import trio

from _helpers.process import start_serve
from _helpers.ws import moshi_handshake, moshi_url, raw_open, read_until_closed
from pplex_trio.client import open_websocket


async def test_shutdown_closes_live_queued_and_prefilling_conversations_with_1001(virtual_server, autojump_clock):
    handle = await virtual_server(slots=2, prefill_steps=1)
    results = {}
    connected = trio.Semaphore(0)

    async def live_moshi():
        async with handle.open_websocket(moshi_url(handle.ws_url)) as ws:
            await moshi_handshake(ws)
            connected.release()
            results["moshi"] = await read_until_closed(ws, timeout=3)

    async def live_raw():
        async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
            await raw_open(ws)
            connected.release()
            results["raw"] = await read_until_closed(ws, timeout=3)

    async def queued():
        async with handle.open_websocket(moshi_url(handle.ws_url)) as ws:
            connected.release()
            results["queued"] = await read_until_closed(ws, timeout=3)

    async with trio.open_nursery() as clients:
        clients.start_soon(live_moshi)
        clients.start_soon(live_raw)
        for _ in range(2):
            await connected.acquire()
        clients.start_soon(queued)
        await connected.acquire()
        await trio.sleep(0.2)
        started = trio.current_time()
        await handle.shutdown()
        assert trio.current_time() - started <= 0.05  # its clients read: every conversation closed at once
    with trio.fail_after(started + 1.0 + 0.05 - trio.current_time()):  # the connections get the grace, no more
        await handle.stopped.wait()  # serve() returns once hypercorn and the actor have stopped
    assert {name: r.code for name, r in results.items()} == {"moshi": 1001, "raw": 1001, "queued": 1001}
    assert any(m.startswith(b"\x05this server is shutting down;") for m in results["moshi"].messages)


def test_sigterm_closes_conversations_with_1001_and_exits_0():
    """The real command: `pplex-trio serve`, a client, then SIGTERM."""
    proc, port, _ = start_serve("--model", "echo:prompt=1", "--slots", "1")
    try:

        async def talk():
            async with open_websocket(f"ws://127.0.0.1:{port}/api/chat") as ws:
                await moshi_handshake(ws)
                proc.send_signal(signal.SIGTERM)
                started = trio.current_time()
                closed = await read_until_closed(ws, timeout=3)
                return closed, trio.current_time() - started

        closed, elapsed = trio.run(talk)
        assert closed.code == 1001
        assert elapsed < 1.0
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def test_ctrl_c_to_the_process_group_stops_cleanly_without_tracebacks():
    """A terminal's Ctrl-C reaches the server and its encoder child alike: one clean stop, no traceback."""
    proc, _, _ = start_serve("--model", "echo", new_session=True)  # --opus-encoder auto: the child, with libopus
    try:
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.stderr.read()
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "server stopped" in err
