"""End to end, both protocols, (for Moshi) real Ogg Opus: the real server on the virtual network and clock.

The clients stream in exact real time on the virtual clock, so what comes back
is the same at every run, however loaded the machine.
"""

import json

import numpy as np
import sphn
import trio

from _helpers.audio import best_lag, correlation_at
from _helpers.ws import FRAME, SR, moshi_handshake, moshi_url, opus_messages, raw_open, read_until_closed
from pplex_trio.server import ServerSettings


def speech(path, seconds):
    pcm, sr = sphn.read(str(path))
    assert sr == SR
    return np.ascontiguousarray(pcm[0, : int(seconds * SR)])


def opus_pass(pcm):
    """One encode + decode through sphn, as the client and server each do once."""
    writer, reader = sphn.OpusStreamWriter(SR), sphn.OpusStreamReader(SR)
    out = [reader.append_bytes(writer.append_pcm(pcm[i : i + FRAME])) for i in range(0, pcm.size, FRAME)]
    return np.concatenate(out)


async def test_moshi_echo_of_real_speech(virtual_server, autojump_clock, speech_wav):
    """Speech sent as Ogg Opus comes back at the engine's delay after two Opus passes.

    Threshold: one sphn Opus pass of this speech measures a correlation of
    ~0.94-0.95 (computed below, independently of the server), two passes
    ~0.89.  0.8 leaves room for the server's encoder differing from sphn's,
    while any misalignment (even a frame off, or reordered pages) drops far
    below it: wrong lags score < 0.3.
    """
    pcm = speech(speech_wav, 6.0)
    # Opus's own delay, measured on one local pass: the expected lag adds it twice.
    single_lag, single_corr = best_lag(pcm, opus_pass(pcm), 0, 600)
    assert single_corr > 0.9
    handle = await virtual_server(delay_frames=1)
    decoder = sphn.OpusStreamReader(SR)
    received, texts = [], []
    async with handle.open_websocket(moshi_url(handle.ws_url, text_prompt="Echo me.", voice_prompt="NATF0.pt")) as ws:
        await moshi_handshake(ws)

        async def send():
            deadline = trio.current_time()
            for pages in opus_messages(pcm):
                for page in pages:  # one page (40 ms) per message, like the browser
                    await ws.send_message(b"\x01" + page)
                    deadline += FRAME / SR / 2
                    await trio.sleep_until(deadline)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            expected_frames = pcm.size // FRAME
            with trio.fail_after(20):
                while len(texts) < expected_frames + 2:
                    message = await ws.get_message()
                    kind, payload = message[0], message[1:]
                    if kind == 1:
                        received.append(decoder.append_bytes(payload))
                    elif kind == 2:
                        texts.append(payload.decode())
                    else:
                        assert kind == 6, f"unexpected kind {kind}"
    got = np.concatenate(received)
    # The output timeline is the tick timeline: ticks that ran before the
    # first input frame was complete carry silence, so the echo starts k
    # whole frames later (k is 0-3, depending on the phase of the client).
    engine_delay = 1 * FRAME
    lag, corr = best_lag(pcm, got, 0, engine_delay + 5 * FRAME)
    k, rest = divmod(lag - engine_delay - 2 * single_lag, FRAME)
    assert 0 <= k <= 3 and min(rest, FRAME - rest) <= 4, (lag, single_lag)
    assert corr > 0.8, corr
    for wrong in (lag - FRAME, lag + FRAME, lag + 120):
        assert abs(correlation_at(pcm, got, wrong)) < 0.3
    # Text pieces: one per frame, in order, none lost.
    assert texts == [f" {i}" for i in range(len(texts))]


async def test_raw_echo_is_exact(virtual_server, autojump_clock):
    handle = await virtual_server(delay_frames=2, first_frame_timeout=ServerSettings().first_frame_timeout)
    rng = np.random.default_rng(1)
    frames = [rng.uniform(-1, 1, FRAME).astype(np.float32) for _ in range(20)]
    stream = np.concatenate(frames + [np.zeros(2 * FRAME, np.float32)])
    received, texts = [], []
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        assert await raw_open(ws, persona="exact", voice="NATM1.pt") == []

        async def send():
            # Odd-sized chunks at real-time pace: the server reframes them.
            deadline = trio.current_time()
            for chunk in np.array_split(stream, 37):
                await ws.send_message(chunk.astype("<f4").tobytes())
                deadline += chunk.size / SR
                await trio.sleep_until(deadline)
            await ws.send_message(json.dumps({"type": "close"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            closed = await read_until_closed(ws, timeout=20)
    assert closed.code == 1000
    for message in closed.messages:
        if isinstance(message, bytes):
            received.append(np.frombuffer(message, dtype="<f4"))
        else:
            event = json.loads(message)
            if event["type"] == "text":
                texts.append(event["text"])
    assert json.loads(closed.messages[-1]) == {"type": "done"}
    assert all(r.size == FRAME for r in received)
    # Ticks without input carry silence (before the first frame, or if the
    # client ran late); every input frame must come back bit-exact, in order,
    # at least the echo's delay later, and close must flush them all.
    voiced = [i for i, r in enumerate(received) if r.any()]
    assert voiced[0] == 2  # the echo's delay exactly: the first step takes the first frame
    assert len(voiced) == len(frames)
    for index, frame in zip(voiced, frames):
        np.testing.assert_array_equal(received[index], frame)
    assert texts == [f" {i}" for i in range(len(received))]


async def test_each_slot_gets_its_own_conversation(virtual_server, autojump_clock):
    """Two concurrent conversations on two slots: no crosstalk."""
    handle = await virtual_server(slots=2, delay_frames=0)
    results = {}

    async def talk(value):
        async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
            await raw_open(ws, persona=f"p{value}")
            for _ in range(8):
                await ws.send_message(np.full(FRAME, value, np.float32).tobytes())
                await trio.sleep(FRAME / SR)
            await ws.send_message(json.dumps({"type": "close"}))
            closed = await read_until_closed(ws, timeout=10)
        pcm = np.concatenate([np.frombuffer(m, "<f4") for m in closed.messages if isinstance(m, bytes)])
        results[value] = pcm

    async with trio.open_nursery() as nursery:
        nursery.start_soon(talk, 0.25)
        nursery.start_soon(talk, -0.5)
    for value, pcm in results.items():
        assert pcm.size >= 8 * FRAME
        voiced = pcm[pcm != 0]
        assert voiced.size >= 8 * FRAME and np.all(voiced == np.float32(value))
