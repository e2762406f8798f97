"""Telnyx's, Plivo's and Exotel's side of a media stream, for tests: each carrier's events as its documentation
shows them.

Each message a call sends as the carrier is taken by that carrier's Pipecat
serializer (the independent reference of the wire format, on the bot's side of
the same stream): its ``deserialize`` must take our ``media`` as the caller's
audio, exactly, and our ``dtmf`` as the key.  What the server sends back is
decoded here with CPython's ``audioop`` (μ-law) or numpy (16-bit PCM), not the
server's code.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import types
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import trio

from _helpers.twilio import CarrierEnd, now

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

    from pipecat.frames.frames import InputAudioRawFrame, InputDTMFFrame, InterruptionFrame, OutputAudioRawFrame
    from pipecat.serializers.exotel import ExotelFrameSerializer
    from pipecat.serializers.plivo import PlivoFrameSerializer
    from pipecat.serializers.telnyx import TelnyxFrameSerializer

RATE = 8_000
STREAM_ID = "32de0dea-53cb-4b21-89a4-9b3a7cfb6d41"
CALL_ID = "v3:u5OAKGEPT3Dx8SZSSDRWEMdNH2OripQhO"
ACCOUNT_ID = "3fa85f64-5717-4562-b3fc-2c963f66afa6"


def pcm16_bytes(pcm: np.ndarray) -> bytes:
    return (np.clip(pcm, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()


def ulaw_bytes(pcm: np.ndarray) -> bytes:
    return audioop.lin2ulaw(pcm16_bytes(pcm), 2)


@dataclasses.dataclass(frozen=True)
class CarrierWire:
    """One carrier's wire, as its documentation shows it."""

    name: str
    encode: Callable[[np.ndarray], bytes]  # the caller's audio as the carrier sends it
    decode: Callable[[bytes], np.ndarray]  # what the server sends back → float32, decoded here
    chunk_seconds: float  # how much audio each of its media messages carries
    stream_key: str | None  # the stream's id in our messages, if they carry it
    clear: str  # the name of our clear, and of our media and mark
    media: str
    mark: str
    serializer: Callable[[], Any]
    connected: Callable[[], dict[str, Any] | None]
    start: Callable[[dict[str, str], str], dict[str, Any]]  # (parameters, encoding) → the start event
    media_event: Callable[[int, str], dict[str, Any]]  # (sequence number, base64 payload) → a media event
    mark_echo: Callable[[str], dict[str, Any]]
    dtmf: Callable[[str], dict[str, Any]]
    stop: Callable[[], dict[str, Any]]

    @property
    def path(self) -> str:
        return f"/telephony/{self.name}"

    @property
    def sample_bytes(self) -> int:
        return len(self.encode(np.zeros(1, np.float32)))


def _setup(serializer: Any) -> Any:
    now(serializer.setup(types.SimpleNamespace(audio_in_sample_rate=RATE)))
    return serializer


def _ulaw_float(data: bytes) -> np.ndarray:
    return np.frombuffer(audioop.ulaw2lin(data, 2), "<i2").astype(np.float32) / 32768


def _pcm16_float(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768


TELNYX = CarrierWire(
    name="telnyx",
    encode=ulaw_bytes,
    decode=_ulaw_float,
    chunk_seconds=0.02,
    stream_key=None,
    clear="clear",
    media="media",
    mark="mark",
    serializer=lambda: _setup(
        TelnyxFrameSerializer(
            STREAM_ID, "PCMU", "PCMU", params=TelnyxFrameSerializer.InputParams(auto_hang_up=False, sample_rate=RATE)
        )
    ),
    connected=lambda: {"event": "connected", "version": "1.0.0"},
    start=lambda parameters, encoding="PCMU": {
        "event": "start",
        "sequence_number": "1",
        "stream_id": STREAM_ID,
        "start": {
            "user_id": ACCOUNT_ID,
            "call_control_id": CALL_ID,
            "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
            "media_format": {"encoding": encoding, "sample_rate": RATE, "channels": 1},
            "custom_parameters": parameters,
        },
    },
    media_event=lambda n, payload: {
        "event": "media",
        "sequence_number": str(n),
        "stream_id": STREAM_ID,
        "media": {"track": "inbound", "chunk": str(n), "timestamp": str(20 * n), "payload": payload},
    },
    mark_echo=lambda name: {"event": "mark", "sequence_number": "9", "stream_id": STREAM_ID, "mark": {"name": name}},
    dtmf=lambda digit: {
        "event": "dtmf",
        "stream_id": STREAM_ID,
        "occurred_at": "2026-12-06T12:00:00.000000Z",
        "sequence_number": "10",
        "dtmf": {"digit": digit},
    },
    stop=lambda: {
        "event": "stop",
        "sequence_number": "11",
        "stream_id": STREAM_ID,
        "stop": {"user_id": ACCOUNT_ID, "call_control_id": CALL_ID},
    },
)

PLIVO = CarrierWire(
    name="plivo",
    encode=ulaw_bytes,
    decode=_ulaw_float,
    chunk_seconds=0.02,
    stream_key="streamId",
    clear="clearAudio",
    media="playAudio",
    mark="checkpoint",
    serializer=lambda: _setup(
        PlivoFrameSerializer(STREAM_ID, params=PlivoFrameSerializer.InputParams(auto_hang_up=False, sample_rate=RATE))
    ),
    connected=lambda: None,  # Plivo opens with its start
    start=lambda parameters, encoding="audio/x-mulaw": {
        "event": "start",
        "sequenceNumber": 0,
        "start": {
            "callId": CALL_ID,
            "streamId": STREAM_ID,
            "accountId": ACCOUNT_ID,
            "tracks": ["inbound"],
            "mediaFormat": {"encoding": encoding, "sampleRate": RATE},
        },
        "extra_headers": json.dumps(parameters),
    },
    media_event=lambda n, payload: {
        "event": "media",
        "sequenceNumber": n,
        "streamId": STREAM_ID,
        "media": {"track": "inbound", "timestamp": str(20 * n), "chunk": n, "payload": payload},
    },
    mark_echo=lambda name: {"event": "playedStream", "sequenceNumber": 9, "streamId": STREAM_ID, "name": name},
    dtmf=lambda digit: {
        "event": "dtmf",
        "sequenceNumber": 10,
        "streamId": STREAM_ID,
        "dtmf": {"track": "inbound", "digit": digit, "timestamp": "1000"},
    },
    stop=lambda: {"event": "stop", "sequenceNumber": 11, "streamId": STREAM_ID},
)

EXOTEL = CarrierWire(
    name="exotel",
    encode=pcm16_bytes,
    decode=_pcm16_float,
    chunk_seconds=0.1,
    stream_key="stream_sid",
    clear="clear",
    media="media",
    mark="mark",
    serializer=lambda: _setup(
        ExotelFrameSerializer(STREAM_ID, params=ExotelFrameSerializer.InputParams(sample_rate=RATE))
    ),
    connected=lambda: {"event": "connected"},
    start=lambda parameters, encoding="audio/x-raw": {
        "event": "start",
        "sequence_number": "1",
        "stream_sid": STREAM_ID,
        "start": {
            "stream_sid": STREAM_ID,
            "call_sid": CALL_ID,
            "account_sid": ACCOUNT_ID,
            "from": "+919876543210",
            "to": "+918047491899",
            "custom_parameters": parameters,
            "media_format": {"encoding": encoding, "sample_rate": "8000", "bit_rate": "16"},
        },
    },
    media_event=lambda n, payload: {
        "event": "media",
        "sequence_number": str(n),
        "stream_sid": STREAM_ID,
        "media": {"chunk": str(n), "timestamp": str(100 * n), "payload": payload},
    },
    mark_echo=lambda name: {"event": "mark", "sequence_number": "9", "stream_sid": STREAM_ID, "mark": {"name": name}},
    dtmf=lambda digit: {
        "event": "dtmf",
        "sequence_number": "10",
        "stream_sid": STREAM_ID,
        "dtmf": {"digit": digit, "duration": "100"},
    },
    stop=lambda: {
        "event": "stop",
        "sequence_number": "11",
        "stream_sid": STREAM_ID,
        "stop": {"call_sid": CALL_ID, "account_sid": ACCOUNT_ID, "reason": "callended"},
    },
)

WIRES = {wire.name: wire for wire in (TELNYX, PLIVO, EXOTEL)}


def reference_clear(wire: CarrierWire) -> dict[str, Any]:
    return json.loads(now(wire.serializer().serialize(InterruptionFrame())))


def reference_media(wire: CarrierWire, pcm: np.ndarray) -> dict[str, Any]:
    frame = OutputAudioRawFrame(pcm16_bytes(pcm), RATE, 1)
    return json.loads(now(wire.serializer().serialize(frame)))


def shape(value: Any) -> Any:
    """A message with its payloads blanked: what two messages share when they say the same in different audio."""
    if isinstance(value, dict):
        return {k: "…" if k == "payload" else shape(v) for k, v in value.items()}
    return value


class CarrierCall(CarrierEnd):
    """The carrier's end of one stream: sends its events, reads (and keeps) the server's."""

    def __init__(self, wire: CarrierWire, ws: Any, *, check: bool = False):
        super().__init__(ws)
        self.wire = wire
        self.checker = wire.serializer() if check else None
        self._sequence = itertools.count(2)

    async def send(self, event: dict[str, Any]) -> None:
        message = json.dumps(event)
        if self.checker is not None and event["event"] in ("media", "dtmf"):
            frame = now(self.checker.deserialize(message))
            if event["event"] == "media":
                audio = base64.b64decode(event["media"]["payload"])
                assert isinstance(frame, InputAudioRawFrame)
                assert frame.audio == (audio if self.wire.sample_bytes == 2 else audioop.ulaw2lin(audio, 2))
            else:
                assert isinstance(frame, InputDTMFFrame) and frame.button.value == event["dtmf"]["digit"]
        await self.ws.send_message(message)

    async def open(self, **parameters: str) -> None:
        connected = self.wire.connected()
        if connected is not None:
            await self.send(connected)
        await self.send(self.wire.start(parameters))

    async def media(self, audio: bytes) -> None:
        await self.send(self.wire.media_event(next(self._sequence), base64.b64encode(audio).decode()))

    async def talk(self, pcm: np.ndarray) -> None:
        """``pcm`` as the carrier sends it: a message every chunk_seconds, on the clock."""
        step = round(self.wire.chunk_seconds * RATE)
        deadline = trio.current_time()
        for i in range(0, pcm.size, step):
            await self.media(self.wire.encode(pcm[i : i + step]))
            deadline += self.wire.chunk_seconds
            await trio.sleep_until(deadline)

    def check(self, event: dict[str, Any]) -> None:
        if self.wire.stream_key is not None:
            assert event[self.wire.stream_key] == STREAM_ID, event

    def audio(self) -> np.ndarray:
        """The audio the server sent, in order, decoded here."""
        return self.wire.decode(b"".join(base64.b64decode(e["media"]["payload"]) for e in self.of(self.wire.media)))
