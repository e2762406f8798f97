"""The official ``openai`` SDK's Live client (``client.live.connect()``), unmodified, in whole conversations.

Against the echo server with real speech: PCM16 at 24 kHz and G.711 μ-law at 8 kHz come back as what was
said, muting silences what the model hears, a refused event is answered with its id while the call goes on,
and ``session.close`` ends with ``session.closed`` and its usage.  Against the tiny model: the same client
hears the model's voice.  Every server event is validated against the SDK's ``openai.types.live.ServerEvent``
(the SDK itself does not validate what it receives).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
from typing import Any

import numpy as np
import pytest
import soxr

openai = pytest.importorskip("openai")
from websockets.exceptions import ConnectionClosed  # noqa: E402

from _helpers.aio import run_asyncio  # noqa: E402
from _helpers.browser import ThreadServer  # noqa: E402
from _helpers.live import checked  # noqa: E402
from pplex_trio.codec import ulaw_decode, ulaw_encode  # noqa: E402
from pplex_trio.server import ServerSettings  # noqa: E402

RATE = 24_000
CHUNK_MS = 100  # what LiveKit sends; the SDK leaves it to the application
PERSONA = "You are a friendly assistant. Keep your answers short."


@dataclasses.dataclass
class Call:
    events: list[tuple[float, dict[str, Any]]]  # every server event, with when it came
    muted_at: float | None
    unmuted_at: float | None

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for _, event in self.events if event["type"] == kind]

    def audio(self) -> bytes:
        return b"".join(base64.b64decode(e["delta"]) for e in self.of("session.output_audio.delta"))


def chunks(line, audio_format: dict[str, Any]) -> list[bytes]:
    """The caller's line in the session's format, in 100 ms appends."""
    if audio_format["type"] == "audio/pcm":
        return line.chunks(audio_format["rate"], CHUNK_MS)
    wire = ulaw_encode(line.at(8_000))
    size = 8_000 * CHUNK_MS // 1000
    return [wire[i : i + size] for i in range(0, len(wire) - size + 1, size)]


def to_24k(audio: bytes, audio_format: dict[str, Any]) -> np.ndarray:
    if audio_format["type"] == "audio/pcm":
        return np.frombuffer(audio, "<i2").astype(np.float32) / 32768
    return soxr.resample(ulaw_decode(audio), 8_000, RATE).astype(np.float32)


def ulaw_pass(pcm: np.ndarray) -> np.ndarray:
    """What G.711 at 8 kHz leaves of 24 kHz audio, both ways (computed here, for the echo's bar)."""
    return soxr.resample(ulaw_decode(ulaw_encode(soxr.resample(pcm, RATE, 8_000))), 8_000, RATE).astype(np.float32)


async def call(
    url: str, line, audio_format: dict[str, Any], *, mute_second: bool = False, refuse: bool = False
) -> Call:
    client = openai.AsyncOpenAI(api_key="placeholder", base_url=f"{url}/v1")
    events: list[tuple[float, dict[str, Any]]] = []
    muted_at = unmuted_at = None
    async with client.live.connect() as connection:

        async def listen() -> None:
            while True:
                try:
                    event = checked((await connection.recv_bytes()).decode())
                except ConnectionClosed:
                    return
                events.append((time.monotonic(), event))

        listener = asyncio.create_task(listen())
        await connection.session.start(
            session={
                "model": "gpt-live-1",
                "instructions": PERSONA,
                "audio": {"format": audio_format, "output": {"voice": "marin"}},
            },
            event_id="start-1",
        )
        while not any(e["type"] == "session.started" for _, e in events):
            await asyncio.sleep(0.01)
        started = time.monotonic()
        for n, chunk in enumerate(chunks(line, audio_format)):
            at = n * CHUNK_MS / 1000
            if mute_second and muted_at is None and at >= line.second_starts - 0.2:
                await connection.session.input_audio.mute(event_id="mute-1")
                muted_at = time.monotonic()
            if refuse and n == 5:
                await connection.send(
                    {
                        "type": "session.instructions.append",
                        "content": "Be terse.",
                        "delegation_id": None,
                        "event_id": "refused-1",
                    }
                )
            await connection.session.input_audio.append(audio=base64.b64encode(chunk).decode())
            await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK_MS / 1000 - time.monotonic()))
        if muted_at is not None:
            await connection.session.input_audio.unmute(event_id="unmute-1")
            unmuted_at = time.monotonic()
        await connection.session.close(event_id="close-1")
        await asyncio.wait_for(listener, 5)  # session.closed, then the server's 1000 ends the iteration
    await client.close()
    return Call(events, muted_at, unmuted_at)


FORMATS = {"pcm24k": {"type": "audio/pcm", "rate": 24_000}, "pcmu8k": {"type": "audio/pcmu", "rate": 8_000}}


@pytest.mark.parametrize("name", FORMATS)
def test_the_callers_speech_comes_back_in_the_sessions_format(echo_server, caller, assert_echoed, name):
    audio_format = FORMATS[name]
    mark = len(echo_server.log)
    run = run_asyncio(call(echo_server.url, caller, audio_format, refuse=True))

    started = run.of("session.started")[0]
    assert started["client_event_id"] == "start-1"
    assert started["session"]["audio"] == {"format": audio_format, "output": {"voice": "NATF2.pt"}}
    assert started["session"]["instructions"] == PERSONA and started["session"]["model"] == "gpt-live-1"

    # The refused event: an error naming it, and the call went on to the end.
    (error,) = run.of("error")
    assert error["client_event_id"] == "refused-1" and error["error"]["code"] == "unsupported_event"

    # One delta per 80 ms frame: PCM16 at 24 kHz exactly a frame each; at 8 kHz the resampler hands its
    # output on in blocks (some 66 ms), so the deltas vary and add up to the frames, less its delay.
    deltas = run.of("session.output_audio.delta")
    sizes = [len(base64.b64decode(e["delta"])) for e in deltas]
    if name == "pcm24k":
        assert set(sizes) == {1920 * 2}
    else:
        assert 0 <= len(deltas) * 640 - sum(sizes) <= 2 * 640
    heard = to_24k(run.audio(), audio_format)
    codec = None if name == "pcm24k" else ulaw_pass
    assert_echoed(caller.first, heard, codec)
    assert_echoed(caller.second, heard, codec)

    # Text: the echo's frame numbers, each stamped with its own frame on the session timeline.
    texts = run.of("session.output_transcript.delta")
    assert [(int(t["delta"]), t["start_ms"], t["end_ms"]) for t in texts] == [
        (k, 80 * k, 80 * k + 80) for k in range(len(deltas))
    ]

    # The close: session.closed, with the call's length as its usage, then the socket closed cleanly.
    closed = run.of("session.closed")[0]
    assert run.events[-1][1] is closed and closed["reason"] == "close_requested"
    assert closed["client_event_id"] == "close-1"
    assert closed["usage"]["seconds"] == pytest.approx(len(deltas) * 0.08)
    assert echo_server.problems_since(mark) == []


def test_muted_the_model_hears_silence(echo_server, caller, assert_echoed):
    run = run_asyncio(call(echo_server.url, caller, FORMATS["pcm24k"], mute_second=True))
    assert [e["client_event_id"] for e in run.of("session.input_audio.muted")] == ["mute-1"]
    assert [e["client_event_id"] for e in run.of("session.input_audio.unmuted")] == ["unmute-1"]
    heard = to_24k(run.audio(), FORMATS["pcm24k"])
    assert_echoed(caller.first, heard)
    # The second utterance was said while muted: the model heard digital silence of its length instead.
    frames = heard[: heard.size // 1920 * 1920].reshape(-1, 1920)
    silent = int((np.abs(frames).max(axis=1) == 0).sum())
    assert silent >= caller.second.size // 1920
    second = soxr.resample(caller.second, RATE, RATE)  # (a copy, for the correlation below)
    best = max(
        abs(np.corrcoef(second[:12000], heard[k : k + 12000])[0, 1]) if heard[k : k + 12000].any() else 0.0
        for k in range(0, heard.size - 12000, 480)
    )
    assert best < 0.5, best  # nothing of it came back


@pytest.fixture(scope="module")
def tiny_server():
    from pplex_trio.engine._personaplex import PersonaPlexEngine

    engine = PersonaPlexEngine.load("tiny", num_slots=1)
    running = ThreadServer(ServerSettings(host="127.0.0.1", port=0, slots=1, model="tiny"), engine).start()
    yield running
    running.stop()


def test_the_sdk_hears_the_tiny_models_voice(tiny_server, caller):
    run = run_asyncio(call(tiny_server.url, caller, FORMATS["pcm24k"]))
    deltas = run.of("session.output_audio.delta")
    assert len(deltas) >= 40  # the whole line (some 6 s) is answered frame by frame
    assert np.frombuffer(run.audio(), "<i2").any()  # the model's voice (random weights: noise), not silence
    stamps = [(t["start_ms"], t["end_ms"]) for t in run.of("session.output_transcript.delta")]
    assert all(end - start == 80 and start % 80 == 0 for start, end in stamps) and stamps == sorted(stamps)
    assert run.of("session.closed")[0]["reason"] == "close_requested"
    assert json.dumps(run.of("session.started")[0]["session"]["model"]) == '"gpt-live-1"'
