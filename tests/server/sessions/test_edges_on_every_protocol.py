"""The edges of a call on every protocol (the virtual network and clock, the server's defaults): the model's
first step takes the caller's first frame, and a network stall either way costs neither words nor lasting
latency.

The echo engine hands back what the model heard (one frame later), so on the
raw protocol the output says exactly which of the caller's frames were heard.
On the Moshi, Realtime and Live protocols (lossy codecs, or PCM16) the server's own accounts
say it: nothing dropped, silence only skipped, and no lag left.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import sphn
import trio

from _helpers.audio import best_lag
from _helpers.ws import FRAME, SR, moshi_handshake, moshi_url, opus_messages, raw_open
from pplex_trio.codec import is_silent
from pplex_trio.server import ServerSettings

PAGE = FRAME // 2  # 40 ms: what the official client sends per message
DEFAULTS = ServerSettings()


@pytest.fixture(scope="module")
def speech(shared_dir) -> np.ndarray:
    """Real speech: speech_service.wav from 80 ms before its first word."""
    pcm, _ = sphn.read(str(shared_dir / "data" / "speech_service.wav"), sample_rate=SR)
    pcm = pcm[0].astype(np.float32)
    frames = len(pcm) // FRAME
    first = next(i for i in range(frames) if not is_silent(pcm[i * FRAME : (i + 1) * FRAME]))
    return pcm[(first - 1) * FRAME : frames * FRAME]


# -- the first step ------------------------------------------------------------------------------------------


async def test_a_moshi_client_that_talks_a_second_after_the_handshake_hears_the_models_first_words(
    virtual_server, autojump_clock, speech
):
    """Nothing of the model's reaches it before its first frame; then the echo (the model) answers its first
    words from the start."""
    handle = await virtual_server(first_frame_timeout=DEFAULTS.first_frame_timeout)
    decoder = sphn.OpusStreamReader(SR)
    heard: list[np.ndarray] = []
    async with handle.open_websocket(moshi_url(handle.ws_url, voice_prompt="NATF0.pt")) as ws:
        await moshi_handshake(ws)
        with trio.move_on_after(1.0):
            early = await ws.get_message()
            pytest.fail(f"the server sent {early[:1]!r} before the client's first frame")
        pages = [page for frame in opus_messages(speech[: 25 * FRAME]) for page in frame]

        async def talk() -> None:
            for page in pages:
                await ws.send_message(b"\x01" + page)
                await trio.sleep(PAGE / SR)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(talk)
            while sum(chunk.size for chunk in heard) < 25 * FRAME:
                message = await ws.get_message()
                if message[:1] == b"\x01":
                    heard.append(decoder.append_bytes(message[1:]))
    audio = np.concatenate(heard)
    # The echo is one frame late, and Opus delays each way by its own amount (one pass, measured here): with
    # nothing of the model's before the first frame, the words come back at exactly that lag, from the first.
    one_pass = best_lag(speech, opus_pass(speech), 0, 600)[0]
    lag, corr = best_lag(speech[: 20 * FRAME], audio, 0, 4 * FRAME)
    assert abs(lag - (FRAME + 2 * one_pass)) <= 4 and corr > 0.8, (lag, corr, one_pass)  # (our encoder is not sphn's)


def opus_pass(pcm: np.ndarray) -> np.ndarray:
    """One encode + decode through sphn, as the client and server each do once."""
    writer, reader = sphn.OpusStreamWriter(SR), sphn.OpusStreamReader(SR)
    return np.concatenate(
        [reader.append_bytes(writer.append_pcm(pcm[i : i + FRAME])) for i in range(0, pcm.size, FRAME)]
    )


async def test_a_raw_client_that_only_listens_is_stepped_after_the_first_frame_timeout(virtual_server, autojump_clock):
    handle = await virtual_server(first_frame_timeout=2.0)
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws)
        ready = trio.current_time()
        while not isinstance(message := await ws.get_message(), bytes):
            pass
        assert trio.current_time() - ready == pytest.approx(2.0, abs=0.01)
        assert not np.frombuffer(message, "<f4").any()  # (silence: it said nothing)


async def test_a_realtime_conversation_opened_by_response_create_is_stepped_at_once(virtual_server, autojump_clock):
    handle = await virtual_server(first_frame_timeout=DEFAULTS.first_frame_timeout)
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        await ws.send_message(json.dumps({"type": "response.create"}))
        while json.loads(await ws.get_message())["type"] != "response.created":
            pass
        created = trio.current_time()
        while json.loads(await ws.get_message())["type"] != "response.output_audio.delta":
            pass
        assert trio.current_time() - created < 0.1  # the model speaks first, as asked: no wait for a frame


async def test_a_live_client_that_talks_a_second_after_session_started_hears_the_models_first_words(
    virtual_server, autojump_clock, speech
):
    """Live's model, too, is first stepped on the caller's first frame: nothing comes before it, and the echo's
    first frame is the caller's first, one frame late."""
    handle = await virtual_server(first_frame_timeout=DEFAULTS.first_frame_timeout)
    async with handle.open_websocket(handle.ws_url + "/v1/live/sessions") as ws:
        await open_conversation(handle, "live", ws)
        with trio.move_on_after(1.0):
            early = await ws.get_message()
            pytest.fail(f"the server sent {early[:80]} before the client's first frame")
        for page in pages_of("live", speech[: 10 * FRAME]):
            await ws.send_message(page)
            await trio.sleep(PAGE / SR)
        heard = []
        while len(heard) < 8:
            event = json.loads(await ws.get_message())
            if event["type"] == "session.output_audio.delta":
                heard.append(np.frombuffer(base64.b64decode(event["delta"]), "<i2"))
    sent = (np.clip(speech[: 7 * FRAME], -1, 1) * 32767).astype("<i2")
    assert not heard[0].any() and np.array_equal(np.concatenate(heard[1:]), sent)


# -- stalls ------------------------------------------------------------------------------------------------


def raw_payload(pcm: np.ndarray) -> bytes:
    return pcm.astype("<f4").tobytes()


def json_payload(kind: str):
    def encode(pcm: np.ndarray) -> str:
        pcm16 = (np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes()
        return json.dumps({"type": kind, "audio": base64.b64encode(pcm16).decode()})

    return encode


ENCODERS = {
    "raw": raw_payload,
    "realtime": json_payload("input_audio_buffer.append"),
    "live": json_payload("session.input_audio.append"),
}


async def open_conversation(handle, protocol: str, ws) -> None:
    if protocol == "raw":
        await raw_open(ws)
    elif protocol == "moshi":
        await moshi_handshake(ws)
    elif protocol == "live":
        await ws.send_message(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
        assert json.loads(await ws.get_message())["type"] == "session.started"
    else:
        assert json.loads(await ws.get_message())["type"] == "session.created"


def pages_of(protocol: str, pcm: np.ndarray) -> list[bytes | str]:
    if protocol == "moshi":
        return [b"\x01" + page for frame in opus_messages(pcm) for page in frame]
    return [ENCODERS[protocol](pcm[i : i + PAGE]) for i in range(0, pcm.size, PAGE)]


PATHS = {
    "raw": "/v1/audio/duplex",
    "moshi": "/api/chat?voice_prompt=NATF0.pt",
    "realtime": "/v1/realtime",
    "live": "/v1/live/sessions",
}


async def stalled_call(handle, protocol: str, speech: np.ndarray, stall_at: int, seconds: float):
    """Stream ``speech`` in 40 ms pages at real time; the network holds what the client sends from page
    ``stall_at`` on for ``seconds``, then delivers it at once.  Returns the session as ``/api/sessions`` saw it
    every 40 ms (time, its entry), and when the stall ended."""
    pages = pages_of(protocol, speech)
    views: list[tuple[float, dict]] = []
    async with handle.open_websocket(handle.ws_url + PATHS[protocol]) as ws:
        await open_conversation(handle, protocol, ws)
        start = trio.current_time()
        stalled_from = start + stall_at * PAGE / SR

        async def read() -> None:
            while True:
                await ws.get_message()

        async def network() -> None:  # (the client's end of the virtual connection: what it sends is held)
            await trio.sleep_until(stalled_from)
            ws._stream.stall()
            await trio.sleep(seconds)
            ws._stream.unstall()

        async def watch() -> None:
            while True:
                await trio.sleep(2 * PAGE / SR)
                sessions = (await handle.get_json("/api/sessions"))["sessions"]
                if sessions:
                    views.append((trio.current_time(), sessions[0]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            nursery.start_soon(network)
            nursery.start_soon(watch)
            for k, page in enumerate(pages):  # (once the network's buffer is full, the client waits, as on TCP)
                await trio.sleep_until(start + k * PAGE / SR)
                await ws.send_message(page)
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    return views, stalled_from + seconds


@pytest.mark.parametrize("protocol", ["raw", "moshi", "realtime", "live"])
@pytest.mark.parametrize("during", ["speech", "silence"])
@pytest.mark.parametrize("seconds", [0.5, 1.0, 2.5])
async def test_a_stall_costs_no_speech_and_no_lasting_latency_on_every_protocol(
    virtual_server, autojump_clock, speech, protocol, during, seconds
):
    handle = await virtual_server(first_frame_timeout=DEFAULTS.first_frame_timeout, compute_seconds=0.005)
    silent = [is_silent(speech[i * FRAME : (i + 1) * FRAME]) for i in range(len(speech) // FRAME)]
    frame = next(
        i
        for i in range(25, len(silent))
        if (not any(silent[i : i + 13])) == (during == "speech") and (during == "speech" or all(silent[i : i + 13]))
    )
    views, ended = await stalled_call(handle, protocol, speech, 2 * frame, seconds)
    metrics = await handle.metrics()
    assert 'pplex_frames_dropped_total{reason="input_backlog"} 0.0' in metrics
    assert 'pplex_frames_dropped_total{reason="inbound"} 0.0' in metrics
    # Only silence was skipped to catch up: at most the stream's silence.
    caught_up = max(view["input_caught_up_ms"] for _, view in views)
    assert caught_up <= sum(silent) * 80
    # The input waiting for the model grows by the stall, and from 4 s after it is back to what it was before
    # (so what the caller says is heard as soon after it arrives as before).
    before = [view["input_backlog_ms"] for at, view in views if at < ended - seconds]
    after = [view["input_backlog_ms"] for at, view in views if at > ended + 4.0]
    assert max(after) <= max(before) + 40, (max(before), max(after))
    assert max(view["input_behind_ms"] for at, view in views if at > ended + 4.0) == 0
    if during == "silence":
        assert caught_up >= seconds * 1000 - 80  # worked off in the pause it fell in


@pytest.mark.parametrize("protocol", ["raw", "moshi", "live"])
async def test_a_downlink_stall_costs_no_text_nor_speech_and_no_lasting_delay(
    virtual_server, autojump_clock, speech, protocol
):
    """What the client receives is held by the network for 2.5 s while it talks on, and once the network's
    buffers are full the server's writes wait: every text piece comes, the model's silent frames are what is
    left out, and 4 s after the stall the client is back in real time.  (A Moshi stream is small: 8 KiB of
    buffers hold a few seconds of it.)"""
    handle = await virtual_server(first_frame_timeout=DEFAULTS.first_frame_timeout, compute_seconds=0.005)
    pages = pages_of(protocol, speech)
    texts: list[str] = []
    stamps: list[tuple[str, int, int]] = []  # (Live) each text delta and its place on the session timeline
    arrivals: list[float] = []
    buffer = 8 * 1024 if protocol == "moshi" else None
    async with handle.open_websocket(handle.ws_url + PATHS[protocol], receive_buffer=buffer) as ws:
        await open_conversation(handle, protocol, ws)
        start = trio.current_time()

        async def read() -> None:
            while True:
                message = await ws.get_message()
                if protocol == "raw":
                    if isinstance(message, bytes):
                        arrivals.append(trio.current_time())
                    elif json.loads(message)["type"] == "text":
                        texts.append(json.loads(message)["text"])
                elif protocol == "live":
                    event = json.loads(message)
                    if event["type"] == "session.output_audio.delta":
                        arrivals.append(trio.current_time())
                    elif event["type"] == "session.output_transcript.delta":
                        texts.append(event["delta"])
                        stamps.append((event["delta"], event["start_ms"], event["end_ms"]))
                elif message[:1] == b"\x01":
                    arrivals.append(trio.current_time())
                elif message[:1] == b"\x02":
                    texts.append(message[1:].decode())

        async def network() -> None:
            await trio.sleep_until(start + 2.0)
            ws._stream.stall(sending=False)  # what the client receives is held on its way
            await trio.sleep(2.5)
            ws._stream.unstall()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            nursery.start_soon(network)
            for k, page in enumerate(pages):
                await trio.sleep_until(start + k * PAGE / SR)
                await ws.send_message(page)
            await trio.sleep(1.0)
            session = (await handle.get_json("/api/sessions"))["sessions"][0]
            nursery.cancel_scope.cancel()
    pieces = "".join(texts).split()
    assert (
        pieces == [str(n) for n in range(len(pieces))] and len(pieces) >= len(speech) // FRAME
    )  # every piece, in order
    assert session["output_caught_up_frames"] > 0
    if protocol == "live":
        # Each delta is stamped with the frame it came with: its own piece (the last) is that frame's number, and
        # the pieces of frames left out for the stalled reader ride on it (so the frames left out are gaps on
        # the timeline, and the text keeps its order).
        assert all(end - start == 80 and start == 80 * int(delta.split()[-1]) for delta, start, end in stamps)
        assert any(len(delta.split()) > 1 for delta, _, _ in stamps)  # (the stall left frames out)
    assert 'pplex_frames_dropped_total{reason="output_backlog"} 0.0' in await handle.metrics()
    steady = [b - a for a, b in zip(arrivals, arrivals[1:]) if a > start + 4.5 + 4.0]
    assert steady and max(steady) < 0.2  # a frame about every tick again, not a backlog played out
