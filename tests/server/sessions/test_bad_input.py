"""Every kind of bad input gets a clear error or close code, and hurts no one else.

Each case runs beside a *witness*: a raw-protocol conversation on the same
server that streams known audio throughout and must get every frame back,
bit-exact and in order.  The real server on the virtual network and clock.
"""

import json

import numpy as np
import pytest
import trio

from _helpers.ws import errors_in, moshi_handshake, moshi_url, raw_open, read_until_closed

LIMIT = 64 * 1024  # the test server's max message size


async def moshi_send_after_handshake(handle, message):
    async with handle.open_websocket(moshi_url(handle.ws_url)) as ws:
        await moshi_handshake(ws)
        await ws.send_message(message)
        return await read_until_closed(ws)


async def moshi_connect_with(handle, params):
    async with handle.open_websocket(moshi_url(handle.ws_url, **params)) as ws:
        return await read_until_closed(ws)


async def raw_send_after_open(handle, message):
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws)
        await ws.send_message(message)
        return await read_until_closed(ws)


async def raw_open_with(handle, message):
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await ws.send_message(message)
        return await read_until_closed(ws)


CASES = {
    "garbage after 0x01": (moshi_send_after_handshake, (b"\x01" + b"not an ogg page" * 8,), 1007, "Ogg Opus"),
    "empty frame": (moshi_send_after_handshake, (b"",), 1007, "empty message"),
    "text frame on /api/chat": (moshi_send_after_handshake, ("hello",), 1003, "binary"),
    "oversized moshi message": (moshi_send_after_handshake, (b"\x01" + bytes(LIMIT + 10),), 1009, "over the limit"),
    "bad JSON": (raw_send_after_open, ("{oops",), 1007, "JSON"),
    "unknown type": (raw_send_after_open, ('{"type": "dance"}',), 1003, "unknown message type"),
    "PCM not whole samples": (raw_send_after_open, (b"\x00" * 4 * 100 + b"\x01",), 1007, "multiple of 4"),
    "NaN samples": (raw_send_after_open, (np.array([0.1, np.nan], np.float32).tobytes(),), 1007, "NaN"),
    "oversized raw message": (raw_send_after_open, (bytes(LIMIT + 4),), 1009, "over the limit"),
    "voice with ../": (moshi_connect_with, ({"voice_prompt": "../../etc/passwd"},), 1008, "bare file name"),
    "unknown voice": (moshi_connect_with, ({"voice_prompt": "NOBODY.pt"},), 1008, "/api/voices"),
    "persona over the limit": (moshi_connect_with, ({"text_prompt": "x" * 1001},), 1008, "limit is 1000"),
    "bad temperature": (moshi_connect_with, ({"text_temperature": "hot"},), 1008, "text_temperature"),
    "bad top-k": (moshi_connect_with, ({"audio_topk": "0"},), 1008, "audio_topk"),
    "bad seed": (moshi_connect_with, ({"text_seed": "1.5"},), 1008, "text_seed"),
    "raw voice with ../": (raw_open_with, (json.dumps({"type": "open", "voice": "../x.pt"}),), 1008, "bare file name"),
    "raw audio before open": (raw_open_with, (np.zeros(10, np.float32).tobytes(),), 1008, '"open"'),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_bad_input_is_answered_and_others_keep_every_frame(virtual_server, autojump_clock, nursery, case):
    action, args, code, words = CASES[case]
    handle = await virtual_server(slots=2, max_message_bytes=LIMIT, prefill_steps=1)
    witness, done = await handle.start_witness(nursery)
    await trio.sleep(0.3)
    closed = await action(handle, *args)
    assert closed.code == code, (closed.code, closed.reason, closed.messages[-3:])
    errors = errors_in(closed.messages)
    if code != 1009 or errors:  # hypercorn's own 1009 backstop has no message
        assert errors and words in errors[-1], errors
    await trio.sleep(0.3)
    witness.stop.set()
    with trio.fail_after(5):
        await done.wait()
    witness.check()


async def test_unknown_kinds_and_control_are_ignored(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, prefill_steps=1)
    async with handle.open_websocket(moshi_url(handle.ws_url)) as ws:
        await moshi_handshake(ws)
        for message in (b"\x42what", b"\x03\x00", b"\x06", b"\x02client text", b"\x07\x01x"):
            await ws.send_message(message)
        texts = []
        with trio.fail_after(3):
            while len(texts) < 5:
                message = await ws.get_message()
                if message[0] == 2:
                    texts.append(message[1:].decode())
        assert texts == [f" {i}" for i in range(5)]  # still live, nothing skipped
    with trio.fail_after(3):
        while (await handle.get_json("/health"))["sessions"]:
            await trio.sleep(0.02)


async def test_a_message_far_over_the_limit_is_refused_at_its_frame_header(virtual_server, autojump_clock):
    """The transport guard closes with 1009 as the header arrives: the client has sent a fraction of its payload.

    A raw client, so that what is read is the close frame itself (a WebSocket library still writing the rest
    may see the reset that follows the close frame before it reads the frame, and report 1006)."""
    from _helpers.bad_client import frame_header

    handle = await virtual_server(slots=1, max_message_bytes=LIMIT, prefill_steps=1)
    client = await handle.bad_client(moshi_url(""))
    while await client.receive() != b"\x00":  # the handshake
        pass
    await client.send_raw(frame_header(3 * LIMIT) + bytes(LIMIT // 4))  # the header and a quarter of the limit
    code, _ = await client.read_until_closed()
    assert code == 1009
    client.close()
