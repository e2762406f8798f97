"""Exotel voice streaming (the Voicebot applet), sans-IO: the stream's events, our messages, the applet's URL.

A flow's Voicebot applet opens a bidirectional stream to a WebSocket URL, given
in the applet or fetched from an HTTPS endpoint that answers ``{"url": "wss://…"}``
(our answer route).  Exotel sends ``connected``, ``start`` (``call_sid``,
``stream_sid``, the URL's query parameters as ``custom_parameters``: up to 3,
256 characters in all, and ``media_format``: raw 16-bit little-endian PCM at
8 kHz, or 16 or 24 kHz when the URL asks with ``sample-rate``), then ``media``
(base64, ~100 ms), ``dtmf``, ``mark`` when what we sent before a mark has
played, and ``stop`` when the call ends.  We send ``media``, ``mark`` and
``clear``, each naming the stream; Exotel wants our audio in multiples of 320
bytes (20 ms at 8 kHz), which our 80 ms frames are, give or take the
resampler's blocks: what is left over goes out with the next frame.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from typing import Any, ClassVar

from ._audio import Encoding, SampleFormat
from ._telephony import CallAudio, CallEvent, CallStart, EventReader, StreamEvents

RATES = (8_000, 16_000, 24_000)
ENCODINGS = ("audio/x-raw", "base64", "raw", "slin")  # what Exotel's documents have called its raw PCM
CHUNK_BYTES = 320  # Exotel plays our audio in multiples of this
_read = EventReader("Exotel voice streaming")


def _rate(value: Any) -> int | None:
    try:
        rate = int(value)
    except (TypeError, ValueError):
        return None
    return rate if rate in RATES and not isinstance(value, (bool, float)) else None


class ExotelCarrier(StreamEvents):
    """One Exotel stream (a :class:`~pplex_trio.protocol.telephony.Carrier`): parse its events, build ours."""

    name: ClassVar[str] = "exotel"
    stream_key: ClassVar[str | None] = "stream_sid"

    def __init__(self) -> None:
        super().__init__()
        self._held = b""  # our audio short of a whole CHUNK_BYTES, sent with the next frame

    def parse(self, message: bytes | str) -> CallEvent | None:
        """The event one Exotel message carries: the caller's audio (16-bit PCM), the start, or one of the common
        events; None for others.
        """
        event = _read.load(message)
        kind = event["event"]
        if kind == "media":
            return CallAudio(_read.payload(_read.object(event, "media"), 2))
        if kind == "start":
            return self._start(event)
        return _read.common(event, kind)  # (else None: events Exotel may add)

    def _start(self, event: Mapping[str, Any]) -> CallStart:
        start = _read.object(event, "start")
        stream_sid = _read.optional_text(start, "stream_sid") or _read.optional_text(event, "stream_sid")
        if stream_sid is None:
            raise _read.malformed("start.stream_sid must be a string")
        media_format = _read.media_format(start, "media_format", {"encoding": "audio/x-raw", "sample_rate": "8000"})
        rate = _rate(media_format.get("sample_rate", "8000"))
        if rate is None or media_format.get("encoding", "audio/x-raw") not in ENCODINGS:
            raise _read.unsupported(media_format, "raw 16-bit PCM (audio/x-raw) at 8000, 16000 or 24000 Hz")
        self.stream_id = stream_sid
        return CallStart(
            call_id=_read.optional_text(start, "call_sid") or "",
            stream_id=stream_sid,
            account_id=_read.optional_text(start, "account_sid"),
            parameters=_read.parameters(start, "custom_parameters", "start"),
            audio_format=SampleFormat(Encoding.PCM16, rate),
        )

    # -- our messages -------------------------------------------------------------

    def media(self, audio: bytes) -> str:
        """A ``media`` message of ``audio`` in whole 320-byte chunks, as Exotel wants; the remainder is held for the
        next one.
        """
        audio = self._held + audio
        whole = len(audio) - len(audio) % CHUNK_BYTES
        audio, self._held = audio[:whole], audio[whole:]
        return super().media(audio)

    def clear(self) -> str:
        """A ``clear`` message; the audio held back for the next chunk is dropped too."""
        self._held = b""
        return super().clear()


def answer_document(stream_url: str, parameters: Mapping[str, str]) -> str:
    """The Voicebot applet's dynamic URL answer: ``{"url": …}``, the stream's URL with ``parameters`` in its
    query (Exotel hands them to the start event as ``custom_parameters``)."""
    return json.dumps({"url": stream_url + ("?" + urllib.parse.urlencode(parameters) if parameters else "")})
