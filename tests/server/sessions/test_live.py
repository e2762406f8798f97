"""`/v1/live/sessions` in the server's own terms (the virtual network and clock, the echo engine).

Every server event read here is validated against the openai SDK's ``openai.types.live.ServerEvent``
(``_helpers.live``).  Clients that stop reading, freeze, vanish or flood are tests/faults/'s, for
every protocol.  The echo hands back what the model heard one frame later, and as text the
model's frame numbers " 0", " 1", ..., so what the caller sent, what the model heard and which frame
each text piece belongs to are all known here without the server's help.
"""

from __future__ import annotations

import base64
import json
import logging
import math

import numpy as np
import pytest
import soxr
import trio

from _helpers.live import PATH, LiveClient, audio_of
from pplex_trio.codec import ulaw_decode, ulaw_encode
from pplex_trio.server import ServerSettings

FRAME = 1920  # samples of 80 ms at 24 kHz
FIRST_FRAME = ServerSettings().first_frame_timeout  # the default: the model's first step takes the first frame
rng = np.random.default_rng(7)


def noise_pcm16(frames: int, rate: int = 24_000) -> bytes:
    """Loud random PCM16: exact through an echo, never mistaken for silence."""
    return rng.integers(-8000, 8000, frames * rate * 80 // 1000, dtype="<i2").tobytes()


async def stream(client: LiveClient, audio: bytes, chunk: int, seconds: float) -> None:
    """``audio`` in appends of ``chunk`` bytes, one every ``seconds`` (real-time pacing)."""
    for i in range(0, len(audio), chunk):
        await client.append(audio[i : i + chunk])
        await trio.sleep(seconds)


async def test_pcm_at_24khz_is_echoed_exactly_from_the_first_frame_after_session_started(
    virtual_server, autojump_clock
):
    handle = await virtual_server(first_frame_timeout=FIRST_FRAME)
    sent = noise_pcm16(12)
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        started = await client.start(event_id="s-1", instructions="Be kind.", audio={"output": {"voice": "marin"}})
        session = started["session"]
        assert started["client_event_id"] == "s-1"
        assert session["model"] == "gpt-live-1" and session["status"] == "active"
        assert session["instructions"] == "Be kind." and session["audio"] == {
            "format": {"type": "audio/pcm", "rate": 24000},
            "output": {"voice": "NATF2.pt"},
        }  # OpenAI's marin
        await stream(client, sent, 2 * FRAME, 0.08)
        while len(audio_of(client.events)) < len(sent) + 2 * FRAME:
            await client.next()
    received = audio_of(client.events)
    assert received[: 2 * FRAME] == bytes(2 * FRAME)  # the echo's one frame of delay
    assert received[2 * FRAME : 2 * FRAME + len(sent)] == sent
    # (only type and delta in the audio events, as on OpenAI's primary WebSocket)
    assert all(set(e) == {"type", "delta"} for e in client.of("session.output_audio.delta"))


@pytest.mark.parametrize("kind, rate", [("audio/pcmu", 8000), ("audio/pcm", 16000)])
async def test_g711_and_pcm_at_16khz_come_back_in_the_sessions_format(virtual_server, autojump_clock, kind, rate):
    handle = await virtual_server(first_frame_timeout=FIRST_FRAME)
    t = np.arange(rate) / rate  # a second of a 440 Hz tone
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    wire = ulaw_encode(tone) if kind == "audio/pcmu" else (tone * 32767).astype("<i2").tobytes()
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        started = await client.start(audio={"format": {"type": kind, "rate": rate}})
        assert started["session"]["audio"]["format"] == {"type": kind, "rate": rate}
        per_frame = len(wire) * 80 // 1000
        await stream(client, wire, per_frame, 0.08)
        while len(audio_of(client.events)) < len(wire) + per_frame:
            await client.next()
    received = audio_of(client.events)
    back = ulaw_decode(received) if kind == "audio/pcmu" else np.frombuffer(received, "<i2") / 32767
    # Resampled to 24 kHz and back: the tone is there, in the session's rate, a frame (and a filter) late.
    expected = soxr.resample(soxr.resample(tone, rate, 24_000), 24_000, rate)
    middle = expected[rate // 4 : 3 * rate // 4]
    lag = rate * 80 // 1000
    window = back[lag : lag + rate]
    corr = max(np.corrcoef(middle, window[k + rate // 4 : k + rate // 4 + middle.size])[0, 1] for k in range(-40, 41))
    assert corr > 0.98


async def test_anything_before_session_start_is_an_error_and_the_connection_waits_on(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        for n, kind in enumerate(
            ["session.input_audio.mute", "session.close", "session.commentary.append", "session.update"]
        ):
            await client.send(kind, event_id=f"e{n}")
            error = await client.next("error")
            assert error["client_event_id"] == error["error"]["client_event_id"] == f"e{n}"
        await client.append(noise_pcm16(1), event_id="a")
        assert (await client.next("error"))["error"]["code"] == "session_not_started"
        await ws.send_message("{not json")
        assert (await client.next("error"))["error"]["code"] == "invalid_json"
        await client.start()  # still usable
        assert [e["type"] for e in client.events] == ["error"] * 6 + ["session.started"]


async def test_a_bad_session_start_is_refused_and_a_good_one_then_starts(virtual_server, autojump_clock):
    handle = await virtual_server(max_prompt_chars=100)
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        await client.send("session.start", event_id="long", session={"model": "m", "instructions": "x" * 101})
        error = (await client.next("error"))["error"]
        assert error["param"] == "session.instructions" and error["client_event_id"] == "long"
        await client.send(
            "session.start", event_id="fmt", session={"audio": {"format": {"type": "audio/pcm", "rate": 8000}}}
        )
        error = (await client.next("error"))["error"]
        assert error["param"] == "session.audio.format" and "16000" in error["message"]
        started = await client.start(instructions="x" * 100)
        assert started["session"]["instructions"] == "x" * 100


async def test_what_session_start_asks_beyond_the_model_is_told_after_session_started(virtual_server, autojump_clock):
    """Delegation, startup history and an unknown voice: an error each, after session.started (an error before
    it ends a Pipecat session and leaves LiveKit's waiting), and the session goes on with the default voice."""
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        started = await client.start(
            event_id="st",
            audio={"output": {"voice": {"id": "nobody.pt"}}},
            delegation={"type": "responses", "responses": {"model": "gpt-5.6-luna", "tools": []}},
            input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        )
        assert started["session"]["audio"]["output"]["voice"] is None
        errors = [(await client.next("error"))["error"] for _ in range(3)]
        assert {e["param"] for e in errors} == {"session.audio.output.voice", "session.delegation", "session.input"}
        assert all(e["client_event_id"] == "st" for e in errors)
        assert "nobody.pt" in next(e["message"] for e in errors if e["param"] == "session.audio.output.voice")
        await client.append(noise_pcm16(1))
        await client.next("session.output_audio.delta")


async def test_unsupported_events_are_answered_with_their_id_and_logged_once(virtual_server, autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="pplex_trio")
    handle = await virtual_server()
    refused = [
        "session.instructions.append",
        "session.thinking.append",
        "session.commentary.append",
        "session.update",
        "session.output_audio.fixture.play",
        "response.create",
        "response.item.create",
        "decision.create",
        "no.such.event",
    ]
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        await client.start()
        for round_ in range(2):
            for n, kind in enumerate(refused):
                await client.send(kind, event_id=f"{round_}-{n}", content="hello", delegation_id=None)
                error = await client.next("error")
                assert error["client_event_id"] == f"{round_}-{n}" and kind[:12] in error["error"]["message"]
        await client.append(noise_pcm16(1))
        await client.next("session.output_audio.delta")  # the call goes on
    notices = [r.getMessage() for r in caplog.records if "(live): refused" in r.getMessage()]
    assert len(notices) == 2  # once per kind of refusal (unsupported, unknown), not once per event
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_muted_the_model_hears_silence_of_the_same_length(virtual_server, autojump_clock):
    handle = await virtual_server(first_frame_timeout=FIRST_FRAME)
    sent = [noise_pcm16(1) for _ in range(9)]
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        await client.start()
        for k, frame in enumerate(sent):
            if k == 3:
                await client.send("session.input_audio.mute", event_id="m")
                assert (await client.next("session.input_audio.muted"))["client_event_id"] == "m"
            if k == 6:
                await client.send("session.input_audio.unmute", event_id="u")
                assert (await client.next("session.input_audio.unmuted"))["client_event_id"] == "u"
            await client.append(frame)
            await trio.sleep(0.08)
        while len(audio_of(client.events)) < 10 * 2 * FRAME:
            await client.next()
    frames = [audio_of(client.events)[i : i + 2 * FRAME] for i in range(0, 20 * FRAME, 2 * FRAME)]
    expected = [bytes(2 * FRAME)] + [f if not 3 <= k < 6 else bytes(2 * FRAME) for k, f in enumerate(sent)]
    assert frames == expected


async def test_transcripts_are_stamped_with_their_frame_and_usage_comes_every_five_seconds(
    virtual_server, autojump_clock
):
    handle = await virtual_server(first_frame_timeout=FIRST_FRAME)
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        await client.start()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream, client, noise_pcm16(150), 2 * FRAME, 0.08)  # 12 s
            while len(client.of("session.output_transcript.delta")) < 140:
                await client.next()
            nursery.cancel_scope.cancel()
    deltas = client.of("session.output_transcript.delta")
    assert [(d["delta"], d["start_ms"], d["end_ms"]) for d in deltas] == [
        (f" {k}", 80 * k, 80 * k + 80) for k in range(len(deltas))
    ]  # the echo's text is its frame number
    ids = [e["event_id"] for e in client.events if "event_id" in e]
    assert len(ids) == len(set(ids))
    # At the end of the first frame that reaches 5 s, then 10 s, of the session timeline.
    assert [u["usage"]["seconds"] for u in client.of("session.usage.updated")] == [
        math.ceil(5000 * k / 80) * 80 / 1000 for k in (1, 2)
    ]


async def test_session_close_flushes_then_session_closed_with_usage_then_1000(virtual_server, autojump_clock):
    handle = await virtual_server(first_frame_timeout=FIRST_FRAME)
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        await client.start()
        await stream(client, noise_pcm16(10), 2 * FRAME, 0.08)
        await client.send("session.close", event_id="bye")
        code, events = await client.until_closed()
    assert code == 1000
    closed = events[-1]
    assert closed["type"] == "session.closed" and closed["reason"] == "close_requested"
    assert closed["client_event_id"] == "bye" and closed["session"]["model"] == "gpt-live-1"
    # Every frame the model took has its answer out first (one out per frame in), and usage is their length.
    frames = len(client.of("session.output_audio.delta"))
    assert frames == 10 and closed["usage"]["seconds"] == pytest.approx(frames * 0.08)
    assert 'pplex_sessions_ended_total{outcome="completed",protocol="live"} 1.0' in await handle.metrics()


async def test_a_queued_session_is_told_its_place_and_what_it_says_meanwhile_is_heard(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, queue_size=1, first_frame_timeout=FIRST_FRAME)
    early = noise_pcm16(4)
    async with (
        handle.open_websocket(handle.ws_url + PATH) as first,
        handle.open_websocket(handle.ws_url + PATH) as second,
    ):
        await LiveClient(first).start()
        waiting = LiveClient(second)
        await waiting.send("session.start", session={"model": "gpt-live-1"})
        info = await waiting.next("info")
        assert info["code"] == "queued" and "number 1" in info["message"]
        await waiting.append(early)
        await first.aclose()
        await waiting.next("session.started")
        while len(audio_of(waiting.events)) < len(early) + 2 * FRAME:
            await waiting.next()
    assert audio_of(waiting.events)[2 * FRAME : 2 * FRAME + len(early)] == early


async def test_the_time_limit_ends_with_session_closed_expired(virtual_server, autojump_clock):
    handle = await virtual_server(max_session_seconds=3)
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        started = await client.start()
        assert started["session"]["expires_at"] > 0
        code, events = await client.until_closed()
    assert code == 1000 and events[-1]["reason"] == "expired"
    assert events[-2]["type"] == "info" and "time limit" in events[-2]["message"]


async def test_a_shutdown_is_told_then_session_closed_remote_hangup_then_1001(virtual_server, autojump_clock):
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        await client.start()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handle.shutdown)
            code, events = await client.until_closed()
    assert code == 1001 and events[-1]["reason"] == "remote_hangup"
    assert "shutting down" in events[-2]["message"]


@pytest.mark.parametrize(
    "message, code, error",
    [
        (json.dumps({"type": "session.input_audio.append", "audio": "not base64!"}), None, "audio is not valid base64"),
        (
            json.dumps({"type": "session.input_audio.append", "audio": base64.b64encode(b"abc").decode()}),
            None,
            "even number of bytes",
        ),
        (json.dumps({"type": "session.input_audio.append", "audio": 5}), None, "base64 string"),
        ("[1, 2]", None, "JSON object"),
        (b"\x00\x01", 1003, "binary frames"),
    ],
)
async def test_bad_messages_after_the_start(virtual_server, autojump_clock, message, code, error):
    handle = await virtual_server()
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        await client.start()
        await ws.send_message(message)
        if code is None:  # an error event, and the call goes on
            assert error in (await client.next("error"))["error"]["message"]
            await client.append(noise_pcm16(1))
            await client.next("session.output_audio.delta")
            return
        closed, events = await client.until_closed()
    assert closed == code and events[-1]["type"] == "session.closed" and events[-1]["reason"] == "remote_hangup"
    assert error in events[-2]["error"]["message"]
