"""Twilio's side of a Media Streams call, for tests: the carrier's events as Twilio's documentation shows them.

Each message the carrier sends can be checked by Pipecat's ``TwilioFrameSerializer``
(the independent reference of the wire format, on the bot's side of the same
stream): its ``deserialize`` must take our ``media`` as the caller's audio and
our ``dtmf`` as a key.  What the server sends back is decoded here with
CPython's ``audioop`` (μ-law), not the server's code.
"""

from __future__ import annotations

import base64
import itertools
import json
import types
import warnings
from typing import Any

import numpy as np
import trio
from trio_websocket import ConnectionClosed

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # the independent μ-law reference

    from pipecat.frames.frames import InputAudioRawFrame, InputDTMFFrame
    from pipecat.serializers.twilio import TwilioFrameSerializer

PATH = "/telephony/twilio"
STREAM_SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
CALL_SID = "CA7b0e4b8e9f2a3c4d5e6f708192a3b4c5"
ACCOUNT_SID = "AC0123456789abcdef0123456789abcdef"


def now(coroutine: Any) -> Any:
    """Run a coroutine that never waits (the serializer's deserialize) to its end, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the coroutine waited on something")


def reference_serializer() -> TwilioFrameSerializer:
    serializer = TwilioFrameSerializer(
        STREAM_SID, params=TwilioFrameSerializer.InputParams(auto_hang_up=False, sample_rate=8000)
    )
    now(serializer.setup(types.SimpleNamespace(audio_in_sample_rate=8000)))
    return serializer


def ulaw_to_float(data: bytes) -> np.ndarray:
    return np.frombuffer(audioop.ulaw2lin(data, 2), "<i2").astype(np.float32) / 32768


def float_to_ulaw(pcm: np.ndarray) -> bytes:
    return audioop.lin2ulaw((np.clip(pcm, -1, 32767 / 32768) * 32768).astype("<i2").tobytes(), 2)


class CarrierEnd:
    """What a carrier's end of a stream does with the server's events, whichever the carrier: read each (``next``,
    checked by the carrier's own class), keep them, pick them out by kind, read on until the close."""

    def __init__(self, ws: Any):
        self.ws = ws
        self.received: list[dict[str, Any]] = []

    def check(self, event: dict[str, Any]) -> None:
        """An event of ours as the carrier would take it (the carrier's class asserts what it must)."""

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        with trio.fail_after(timeout):
            event = json.loads(await self.ws.get_message())
        self.check(event)
        self.received.append(event)
        return event

    async def listen(self) -> None:
        while True:
            await self.next()

    async def until_closed(self, timeout: float = 10.0) -> tuple[int, str | None]:
        with trio.fail_after(timeout):
            while True:
                try:
                    await self.next()
                except ConnectionClosed as exc:
                    return exc.reason.code, exc.reason.reason

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.received if event["event"] == kind]


class TwilioCall(CarrierEnd):
    """The carrier's end of one stream: sends Twilio's events, reads (and keeps) the server's."""

    def __init__(self, ws: Any, *, check: bool = False):
        super().__init__(ws)
        self.checker = reference_serializer() if check else None
        self._sequence = itertools.count(1)
        self._chunk = itertools.count(1)
        self._timestamp_ms = 0

    async def send(self, event: dict[str, Any]) -> None:
        message = json.dumps(event)
        if self.checker is not None and event["event"] in ("media", "dtmf"):
            frame = now(self.checker.deserialize(message))
            if event["event"] == "media":
                assert isinstance(frame, InputAudioRawFrame)
                assert frame.audio == audioop.ulaw2lin(base64.b64decode(event["media"]["payload"]), 2)
            else:
                assert isinstance(frame, InputDTMFFrame) and frame.button.value == event["dtmf"]["digit"]
        await self.ws.send_message(message)

    def _numbered(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"event": kind, "sequenceNumber": str(next(self._sequence)), **fields, "streamSid": STREAM_SID}

    async def connected(self) -> None:
        await self.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})

    async def start(self, encoding: str = "audio/x-mulaw", **parameters: str) -> None:
        await self.send(
            self._numbered(
                "start",
                start={
                    "accountSid": ACCOUNT_SID,
                    "streamSid": STREAM_SID,
                    "callSid": CALL_SID,
                    "tracks": ["inbound"],
                    "customParameters": parameters,
                    "mediaFormat": {"encoding": encoding, "sampleRate": 8000, "channels": 1},
                },
            )
        )

    async def open(self, **parameters: str) -> None:
        await self.connected()
        await self.start(**parameters)

    async def media(self, audio: bytes) -> None:
        """One chunk of the caller's μ-law audio (Twilio sends 160 bytes: 20 ms)."""
        event = self._numbered(
            "media",
            media={
                "track": "inbound",
                "chunk": str(next(self._chunk)),
                "timestamp": str(self._timestamp_ms),
                "payload": base64.b64encode(audio).decode(),
            },
        )
        self._timestamp_ms += len(audio) // 8
        await self.send(event)

    async def mark(self, name: str) -> None:
        await self.send(self._numbered("mark", mark={"name": name}))

    async def dtmf(self, digit: str) -> None:
        await self.send(self._numbered("dtmf", dtmf={"track": "inbound_track", "digit": digit}))

    async def stop(self) -> None:
        await self.send(self._numbered("stop", stop={"accountSid": ACCOUNT_SID, "callSid": CALL_SID}))

    def check(self, event: dict[str, Any]) -> None:
        assert event["streamSid"] == STREAM_SID, event

    def audio(self) -> bytes:
        """The μ-law audio the server sent, in order."""
        return b"".join(base64.b64decode(e["media"]["payload"]) for e in self.of("media"))
