"""A dropped raw connection pauses its conversation; its token resumes it on a new one (``--resume-seconds``).

The real server on the virtual network and clock, with the echo engine: a
frame of value ``v`` comes back as a frame of value ``v`` a frame later, so
what comes back after a resume shows the conversation went on.
"""

import json

import numpy as np
import trio

from _helpers.ws import FRAME, read_until_closed
from pplex_trio.protocol import raw

PATH = "/v1/audio/duplex"


def frame(value: float) -> bytes:
    return raw.pcm_frame(np.full(FRAME, value, np.float32))


async def open_call(handle, **params):
    """A raw call on a connection the test may reset: (the bad client, its ready event)."""
    bad = await handle.bad_client(PATH)
    await bad.send(json.dumps({"type": "open", **params}))
    while (ready := json.loads(await bad.receive()))["type"] != "ready":
        pass
    return bad, ready


async def echoed(receive, value: float, *, timeout: float = 3.0) -> None:
    """Read until a frame of ``value`` comes back."""
    with trio.fail_after(timeout):
        while True:
            message = await receive()
            if isinstance(message, bytes) and np.allclose(raw.decode_pcm(message), value):
                return


async def talk(bad, values) -> None:
    for value in values:
        await bad.send(frame(value))
        await echoed(bad.receive, value)


async def sessions(handle):
    return (await handle.get_json("/api/sessions"))["sessions"]


async def slots(handle):
    return (await handle.get_json("/health"))["slots"]


async def test_a_reset_pauses_the_call_and_its_token_resumes_it_with_the_same_session(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    bad, ready = await open_call(handle, persona="a pirate")
    token = ready["resume"]
    assert len(token) >= 22  # at least 128 random bits, url-safe
    await talk(bad, [0.1, 0.2])
    (before,) = await sessions(handle)
    bad.reset()
    await trio.sleep(5)  # well within the window
    assert (await slots(handle))["held"] == 1 and (await slots(handle))["free"] == 0
    async with handle.open_websocket(PATH) as ws:
        await ws.send_message(json.dumps({"type": "open", "resume": token, "persona": "a nun"}))
        again = json.loads(await ws.get_message())
        assert again["type"] == "ready" and again["resumed"] is True
        assert again["resume"] != token  # a new token for every resume
        assert "ignored" in again["notice"]  # the persona sent with the resume
        (after,) = await sessions(handle)
        assert after["id"] == before["id"] and after["state"] == "live"
        await ws.send_message(frame(0.3))
        await echoed(ws.get_message, 0.3)
    assert (await handle.resumes()).get("resumed") == 1


async def test_a_token_is_spent_by_its_resume_and_a_wrong_one_is_refused_with_1008(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    bad, ready = await open_call(handle)
    bad.reset()
    async with handle.open_websocket(PATH) as ws:
        await ws.send_message(json.dumps({"type": "open", "resume": "not-a-token"}))
        closed = await read_until_closed(ws)
    assert closed.code == 1008 and "unknown, used or expired" in closed.reason
    async with handle.open_websocket(PATH) as ws:
        await ws.send_message(json.dumps({"type": "open", "resume": ready["resume"]}))
        assert json.loads(await ws.get_message())["resumed"] is True
        async with handle.open_websocket(PATH) as reuse:  # the same token again: spent
            await reuse.send_message(json.dumps({"type": "open", "resume": ready["resume"]}))
            closed = await read_until_closed(reuse)
        assert closed.code == 1008
    assert await handle.resumes() == {"resumed": 1, "expired": 0, "refused": 0, "wrong_token": 2}


async def test_at_the_windows_edge_it_resumes_and_after_it_the_slot_is_free(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, resume_seconds=4)
    bad, ready = await open_call(handle)
    await talk(bad, [0.1])
    bad.reset()
    await trio.sleep(3.9)
    async with handle.open_websocket(PATH) as ws:
        await ws.send_message(json.dumps({"type": "open", "resume": ready["resume"]}))
        again = json.loads(await ws.get_message())
        await ws.send_message(frame(0.5))
        await echoed(ws.get_message, 0.5)
    await trio.sleep(4.2)  # the resumed connection closed without "close": paused again, and its window lapses
    assert (await slots(handle))["free"] == 1 and await sessions(handle) == []
    async with handle.open_websocket(PATH) as late:
        await late.send_message(json.dumps({"type": "open", "resume": again["resume"]}))
        closed = await read_until_closed(late)
    assert closed.code == 1008
    assert (await handle.resumes())["expired"] == 1


async def test_the_queue_sees_a_paused_slot_as_held(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, resume_seconds=3, keepalive_interval=0.1)
    bad, _ = await open_call(handle)
    bad.reset()
    async with handle.open_websocket(PATH) as waiting:
        await waiting.send_message(json.dumps({"type": "open"}))
        assert json.loads(await waiting.get_message()) == {"type": "queued", "position": 1}
        waited = trio.current_time()
        with trio.fail_after(5):
            while json.loads(await waiting.get_message())["type"] != "ready":
                pass
        assert trio.current_time() - waited >= 2.5  # the slot was held for the window


async def test_a_resume_while_the_old_connection_lives_takes_the_call_over(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    async with handle.open_websocket(PATH) as old:
        await old.send_message(json.dumps({"type": "open"}))
        token = json.loads(await old.get_message())["resume"]
        async with handle.open_websocket(PATH) as new:
            await new.send_message(json.dumps({"type": "open", "resume": token}))
            closed = await read_until_closed(old)
            assert closed.code == 1008 and "resumed on another connection" in closed.reason
            assert json.loads(await new.get_message())["resumed"] is True
            await new.send_message(frame(0.7))
            await echoed(new.get_message, 0.7)
            assert len(await sessions(handle)) == 1


async def test_a_close_ends_the_call_and_resume_seconds_0_keeps_a_reset_ending_it(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    bad, ready = await open_call(handle)
    await bad.send(json.dumps({"type": "close"}))
    await bad.read_until_closed()
    await trio.sleep(1)
    assert (await slots(handle))["free"] == 1  # "close" ends the call: nothing is paused
    off = await virtual_server(slots=1, resume_seconds=0)
    bad, ready = await open_call(off)
    assert "resume" not in ready  # (no token: nothing to resume)
    bad.reset()
    await trio.sleep(1)
    assert (await slots(off))["free"] == 1
