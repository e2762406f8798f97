"""bench/load's clients: one conversation of real speech over /api/chat, /v1/realtime, /v1/live/sessions or
/telephony/twilio.

The Moshi protocol (``/api/chat``) streams Ogg Opus pages; the OpenAI Realtime
and Live protocols stream JSON events of base64 PCM16 and differ only in their
events' names and the opening (:class:`JsonEvents`); a Twilio call streams
``media`` events of μ-law at 8 kHz every 20 ms, as Twilio does, after its
``connected`` and ``start`` events.  Every stream is
pre-encoded once and replayed, so the generator stays cheap.  ``load.py``
imports (and re-exports) what is here; ``bench/ready.py`` and ``bench/voices.py``
use it through ``load``.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import pathlib
import random
import urllib.parse
from typing import Any

import numpy as np
import soxr
import sphn
import trio

from _helpers import ogg  # (tests/ on the path: load.py puts it there)
from pplex_trio.client import open_websocket
from pplex_trio.codec import pcm16_encode, ulaw_encode

SR, FRAME = 24_000, 1920
TWILIO_RATE = 8_000
GENERATOR_LAG = 0.005  # a page sent this late was delayed by the generator, not the server
DATA = pathlib.Path(__file__).resolve().parent.parent.parent / "shared" / "data"


@dataclasses.dataclass(frozen=True)
class JsonEvents:
    """A protocol of JSON events with base64 PCM16 both ways, as its client here sees it.

    The server writes compact JSON with ``type`` first, so an event is told by how its text begins.
    """

    path: str
    start: tuple[str, ...]  # the client's opening events
    started: str  # how the event saying the conversation is live begins
    append: str  # the type of the client's audio event
    audio: str  # how the server's audio delta begins (one per 80 ms frame)
    text: str | None  # and its transcript delta (None: the protocol carries no text)
    message_ms: int | None = None  # the audio per client message, when the protocol fixes it


REALTIME = JsonEvents(  # live at the first response
    path="/v1/realtime",
    start=('{"type":"response.create"}',),
    started='{"type":"response.created"',
    append="input_audio_buffer.append",
    audio='{"type":"response.output_audio.delta"',
    text='{"type":"response.output_audio_transcript.delta"',
)
LIVE = JsonEvents(  # no turns: live at session.started
    path="/v1/live/sessions",
    start=('{"type":"session.start","session":{"model":"gpt-live-1"}}',),
    started='{"type":"session.started"',
    append="session.input_audio.append",
    audio='{"type":"session.output_audio.delta"',
    text='{"type":"session.output_transcript.delta"',
)
TWILIO_STREAM = "MZ" + "0" * 32
TWILIO = JsonEvents(  # no handshake: live at the first media the server sends
    path="/telephony/twilio",
    start=(
        json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
        json.dumps(
            {
                "event": "start",
                "sequenceNumber": "1",
                "streamSid": TWILIO_STREAM,
                "start": {
                    "streamSid": TWILIO_STREAM,
                    "callSid": "CA" + "0" * 32,
                    "accountSid": "AC" + "0" * 32,
                    "tracks": ["inbound"],
                    "customParameters": {},
                    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                },
            }
        ),
    ),
    started='{"event":"media"',
    append="media",
    audio='{"event":"media"',
    text=None,
    message_ms=20,
)
JSON_EVENTS = {"realtime": REALTIME, "live": LIVE, "twilio": TWILIO}
PATHS = {"moshi": "/api/chat", **{name: events.path for name, events in JSON_EVENTS.items()}}
PROTOCOLS = tuple(PATHS)  # in the order --compare-protocols runs them
ERROR = '{"type":"error"'


# --- the streams ---------------------------------------------------------------------


def speech(seconds: float, folder: pathlib.Path = DATA) -> np.ndarray:
    """Real speech (``folder``'s ``speech_*.wav``), repeated to ``seconds`` (whole frames)."""
    recordings = [sphn.read(str(p), sample_rate=SR)[0][0] for p in sorted(folder.glob("speech_*.wav"))]
    if not recordings:
        raise SystemExit(
            f"no speech recordings (speech_*.wav) in {folder}: bench/load streams real speech from "
            "the shared data folder next to the repository"
        )
    pcm = np.concatenate(recordings)
    repeats = math.ceil(seconds * SR / pcm.size)
    return np.tile(pcm, repeats)[: int(seconds * SR) // FRAME * FRAME]


def encode_appends(seconds: float, page_ms: int, append: str = REALTIME.append) -> list[str]:
    """The same speech as ``append`` events (Realtime's or Live's): base64 PCM16, ``page_ms`` each (two leading
    silent ones, standing in for the Moshi stream's two header pages)."""
    pcm = speech(seconds)
    step = SR * page_ms // 1000
    chunks = [np.zeros(step, np.float32)] * 2 + [pcm[i : i + step] for i in range(0, pcm.size, step)]
    return [json.dumps({"type": append, "audio": base64.b64encode(pcm16_encode(c)).decode()}) for c in chunks]


def encode_pages(seconds: float, page_ms: int, folder: pathlib.Path = DATA) -> list[bytes]:
    """Real speech as the Ogg pages of one continuous stream (headers first)."""
    pcm = speech(seconds, folder)
    writer = sphn.OpusStreamWriter(SR)
    pages: list[bytes] = []
    for i in range(0, pcm.size, FRAME):
        pages.extend(ogg.split_pages(writer.append_pcm(pcm[i : i + FRAME])))
    header, audio = pages[:2], pages[2:]
    if page_ms == 80:  # one message per frame (two pages), like `pplex-trio client`
        audio = [audio[i] + audio[i + 1] for i in range(0, len(audio) - 1, 2)]
    return header + audio


def encode_twilio_media(seconds: float) -> list[str]:
    """The same speech as a Twilio call's ``media`` events: μ-law at 8 kHz, 20 ms each (two leading silent ones)."""
    pcm = soxr.resample(speech(seconds), SR, TWILIO_RATE, quality="HQ")
    step = TWILIO_RATE * 20 // 1000
    chunks = [np.zeros(step, np.float32)] * 2 + [pcm[i : i + step] for i in range(0, pcm.size - step + 1, step)]
    return [
        json.dumps(
            {
                "event": "media",
                "sequenceNumber": str(n + 2),
                "streamSid": TWILIO_STREAM,
                "media": {
                    "track": "inbound",
                    "chunk": str(n + 1),
                    "timestamp": str(20 * n),
                    "payload": base64.b64encode(ulaw_encode(c)).decode(),
                },
            }
        )
        for n, c in enumerate(chunks)
    ]


def encode_stream(protocol: str, seconds: float, page_ms: int) -> list[Any]:
    """What a client of ``protocol`` sends: its messages, the first two before its recorder starts."""
    if protocol == "moshi":
        return encode_pages(seconds, page_ms)
    if protocol == "twilio":
        return encode_twilio_media(seconds)
    return encode_appends(seconds, page_ms, JSON_EVENTS[protocol].append)


# --- one conversation ------------------------------------------------------------------


@dataclasses.dataclass
class ClientStats:
    index: int
    sent_frames: float = 0.0
    audio_received: int = 0
    text_received: int = 0
    decoded_samples: int = 0
    decode_errors: int = 0
    handshake_s: float = math.nan
    error: str = ""
    window_sent: float = 0.0
    window_received: int = 0
    late_sends: int = 0  # pages this generator sent over 5 ms behind schedule (its own stalls)
    window_late_sends: int = 0


async def run_client(
    url: str,
    pages: list[Any],
    page_ms: int,
    stats: ClientStats,
    *,
    decode: bool,
    live: trio.Semaphore,
    stop: trio.Event,
    started_at: float,
    random_phase: bool,
) -> None:
    """One conversation at real-time pace until ``stop``; the protocol is the one ``url``'s path serves.

    ``live`` is released once the conversation is live (or has failed); ``decode`` (Moshi) decodes its audio.
    """
    events = next((e for e in JSON_EVENTS.values() if e.path == urllib.parse.urlsplit(url).path), None)
    reader = sphn.OpusStreamReader(SR) if decode and events is None else None
    if events is not None and events.message_ms:
        page_ms = events.message_ms
    frames_per_message = page_ms / 80
    try:
        async with open_websocket(url) as ws:
            if events is not None:
                for opening in events.start:
                    await ws.send_message(opening)
                while not (message := await ws.get_message()).startswith(events.started):
                    if message.startswith(ERROR):  # (else the run would wait for its 120 s limit)
                        raise RuntimeError(f"refused at the opening: {message[:300]}")
            else:
                while (await ws.get_message()) != b"\x00":
                    pass
            stats.handshake_s = trio.current_time() - started_at
            live.release()
            frame = (lambda page: page) if events is not None else (lambda page: b"\x01" + page)  # noqa: E731

            async def receive() -> None:
                while True:
                    message = await ws.get_message()
                    if events is not None:
                        if message.startswith(events.audio):
                            stats.audio_received += 1
                        elif events.text is not None and message.startswith(events.text):
                            stats.text_received += 1
                    elif message[:1] == b"\x01":
                        stats.audio_received += 1
                        if reader is not None:
                            try:
                                stats.decoded_samples += reader.append_bytes(message[1:]).size
                            except ValueError:
                                stats.decode_errors += 1
                    elif message[:1] == b"\x02":
                        stats.text_received += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                if random_phase:  # like clients whose recorder starts at an arbitrary moment
                    await trio.sleep(random.uniform(0, 0.080))
                for page in pages[:2]:
                    await ws.send_message(frame(page))
                # Like a recorder: the first page goes out once its audio has been recorded.
                deadline = trio.current_time() + page_ms / 1000
                await trio.sleep_until(deadline)
                for page in pages[2:]:
                    if stop.is_set():
                        break
                    if trio.current_time() - deadline > GENERATOR_LAG:
                        stats.late_sends += 1
                    await ws.send_message(frame(page))
                    stats.sent_frames += frames_per_message
                    deadline += page_ms / 1000
                    await trio.sleep_until(deadline)
                await trio.sleep(0.3)  # let the last frames come back
                nursery.cancel_scope.cancel()
    except Exception as exc:  # noqa: BLE001 - a load test reports, never crashes
        stats.error = f"{type(exc).__name__}: {exc}"
        live.release()
