"""Admission, the queue and the slots: the real server on the virtual network and clock.

A client that vanishes in each phase is tested on the fake socket and the virtual clock
(``test_session_states.py``) and, against the whole server, by the fault suite (``tests/faults``).
"""

import json

import numpy as np
import pytest
import trio
import trio.testing

from _helpers.ws import FRAME, errors_in, moshi_handshake, moshi_url, raw_open, read_until_closed
from pplex_trio.engine import EchoEngine


async def test_a_browser_waits_in_queue_with_pings_then_is_served(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, keepalive_interval=0.1)
    async with handle.open_websocket(moshi_url(handle.ws_url)) as first:
        await moshi_handshake(first)
        second = await handle.bad_client("/api/chat", headers=[("Origin", handle.http_url)])
        # Queued: 0x06 pings keep the official client's 10 s inactivity timer alive (a page's script sees
        # no WebSocket pings).
        for _ in range(3):
            assert await second.receive(timeout=2) == b"\x06"
        await first.aclose()
        while (message := await second.receive()) == b"\x06":
            pass
        assert message == b"\x00"
        assert (await second.receive())[0] in (1, 2)  # live: audio or text flows
        second.close()


async def test_a_program_waits_in_queue_on_websocket_pings_alone(virtual_server, autojump_clock):
    """NVIDIA's server sends no 0x06, and LiveKit's PersonaPlex plugin warns at each: a client without an
    Origin (a program) is kept alive by WebSocket pings, which every client library answers."""
    handle = await virtual_server(slots=1, keepalive_interval=0.1, client_timeout=0.6)  # a ping every 0.2 s
    async with handle.open_websocket(moshi_url(handle.ws_url)) as first:
        await moshi_handshake(first)
        second = await handle.bad_client("/api/chat")
        with trio.move_on_after(0.9):
            message = await second.receive(timeout=2)
            raise AssertionError(f"a queued program got {message!r}")
        assert second.pings == 5  # one at the upgrade, then one every 0.2 s, and nothing else
        await first.aclose()
        assert await second.receive() == b"\x00"  # the handshake is its first message
        second.close()


async def test_raw_queue_reports_positions(virtual_server, autojump_clock):
    # (resume_seconds=0: a raw call whose socket closes without its "close" is over at once, not paused)
    handle = await virtual_server(slots=1, keepalive_interval=0.1, resume_seconds=0)
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as first:
        await raw_open(first)
        async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as second:
            async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as third:
                await second.send_message(json.dumps({"type": "open"}))
                assert json.loads(await second.get_message()) == {"type": "queued", "position": 1}
                await third.send_message(json.dumps({"type": "open"}))
                assert json.loads(await third.get_message()) == {"type": "queued", "position": 2}
                await second.aclose()  # leaving the queue moves `third` up
                with trio.fail_after(2):
                    while json.loads(await third.get_message()) != {"type": "queued", "position": 1}:
                        pass
                await first.aclose()
                with trio.fail_after(3):
                    while json.loads(await third.get_message())["type"] != "ready":
                        pass


async def test_queue_timeout_closes_with_1013(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, queue_timeout=0.3)
    async with handle.open_websocket(moshi_url(handle.ws_url)) as first:
        await moshi_handshake(first)
        async with handle.open_websocket(moshi_url(handle.ws_url)) as second:
            queued = trio.current_time()
            closed = await read_until_closed(second, timeout=3)
    assert trio.current_time() - queued == pytest.approx(0.3)  # at the queue timeout: not before, not later
    assert closed.code == 1013
    assert "no conversation slot became free" in errors_in(closed.messages)[0]


async def test_full_queue_closes_with_1013_at_once(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, queue_size=0)
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as first:
        await raw_open(first)
        async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as second:
            await second.send_message(json.dumps({"type": "open"}))
            asked = trio.current_time()
            closed = await read_until_closed(second, timeout=1)
            assert trio.current_time() == asked  # at once: no time passes
    assert closed.code == 1013
    assert "queue is full" in errors_in(closed.messages)[0]


async def test_drain_before_release_end_to_end(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, prefill_steps=1)
    async with handle.open_websocket(moshi_url(handle.ws_url)) as old:
        await moshi_handshake(old)
        handle.threads.hold_engine()  # the next step does not come back until released (a slow GPU call)
        await handle.threads.engine_held.wait()
        await old.aclose()  # leaves while its step is still running
        async with handle.open_websocket(moshi_url(handle.ws_url), origin=handle.http_url) as new:
            assert await new.get_message() == b"\x06"  # queued: the slot is not free
            await trio.testing.wait_all_tasks_blocked()  # the server is idle: the actor waits on the held step
            health = await handle.get_json("/health")
            assert health["queued"] == 1 and health["slots"]["draining"] == 1 and health["slots_free"] == 0
            await trio.sleep(0.3)
            assert (await handle.get_json("/health"))["slots"]["draining"] == 1  # still in flight
            handle.threads.release_engine()
            await moshi_handshake(new)
            texts = []
            with trio.fail_after(2):
                while len(texts) < 2:
                    message = await new.get_message()
                    if message[0] == 2:
                        texts.append(message[1:].decode())
            assert texts == [" 0", " 1"]  # a fresh row: frame numbering restarted


class ExplodingEcho(EchoEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.explode_at = None

    def step(self, modes, pcm):
        if self.explode_at is not None and self._frames.max() >= self.explode_at:
            self.explode_at = None
            raise RuntimeError("simulated CUDA failure")
        return super().step(modes, pcm)


async def test_engine_exception_closes_with_1011_and_the_next_connection_works(virtual_server, autojump_clock):
    engine = ExplodingEcho(1, prefill_steps=1)
    handle = await virtual_server(engine, slots=1)
    async with handle.open_websocket(moshi_url(handle.ws_url)) as ws:
        await moshi_handshake(ws)
        engine.explode_at = 3
        closed = await read_until_closed(ws, timeout=3)
    assert closed.code == 1011
    assert "internal error" in errors_in(closed.messages)[0]
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws)
        await ws.send_message(np.full(FRAME * 3, 0.5, np.float32).tobytes())
        pcm = []
        with trio.fail_after(3):
            while len(pcm) < 5:
                message = await ws.get_message()
                if isinstance(message, bytes):
                    pcm.append(np.frombuffer(message, "<f4"))
        assert any((p == 0.5).all() for p in pcm)
    metrics = await handle.metrics()
    assert 'pplex_errors_total{kind="engine"} 1.0' in metrics
    assert 'outcome="engine_error"' in metrics


async def test_protocol_error_while_queued_is_answered_at_once(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, queue_timeout=30)
    async with handle.open_websocket(moshi_url(handle.ws_url)) as first:
        await moshi_handshake(first)
        async with handle.open_websocket(moshi_url(handle.ws_url), origin=handle.http_url) as second:
            assert await second.get_message() == b"\x06"  # a keepalive: it waits in the queue
            for _ in range(20):  # more than the framework's own buffer of 10 messages
                await second.send_message(b"\x01")
            await second.send_message("not binary")
            closed = await read_until_closed(second, timeout=2)
        assert closed.code == 1003
    assert (await handle.get_json("/health"))["queued"] == 0  # it left the queue before its close went out


async def test_a_persona_change_by_reconnecting_keeps_the_slot(virtual_server, autojump_clock):
    """LiveKit's PersonaPlex plugin changes persona by reconnecting at once: on a full server it gets its slot
    back ahead of the queue, while another client waits on."""
    handle = await virtual_server(slots=1, prefill_steps=1)
    url = "/api/chat?voice_prompt=NATF2.pt&text_prompt="
    agent = await handle.bad_client(url + "Be+kind.", source="127.0.0.2")
    assert await agent.receive() == b"\x00"
    other = await handle.bad_client("/api/chat", source="127.0.0.3")
    await trio.testing.wait_all_tasks_blocked()  # (queued)
    assert (await handle.get_json("/health"))["queued"] == 1
    await agent.close_cleanly()
    agent = await handle.bad_client(url + "Be+brief.", source="127.0.0.2")
    assert await agent.receive() == b"\x00"  # served first: the slot was held for it
    health = await handle.get_json("/health")
    assert health["queued"] == 1 and health["sessions"] == 2
    sessions = (await handle.get_json("/api/sessions"))["sessions"]
    assert sorted(s["state"] for s in sessions) == ["live", "queued"]
    agent.close()
    other.close()
