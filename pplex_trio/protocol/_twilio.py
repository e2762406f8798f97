"""Twilio Media Streams, sans-IO: the stream's events, our messages, the answer document, the signature.

A call answered with ``<Connect><Stream url="wss://…/telephony/twilio">`` opens
a bidirectional stream: Twilio sends ``connected``, ``start`` (the call's ids,
the ``<Parameter>``s of the answer document as ``customParameters``, the media
format: μ-law at 8 kHz), then ``media`` every 20 ms (base64 audio), ``dtmf``
for a key, ``mark`` when what we sent before a mark has played, and ``stop``
when the call ends.  We send ``media``, ``mark`` and ``clear`` (drop the audio
Twilio still holds of ours).  The answer document is TwiML; Twilio signs each
request with ``X-Twilio-Signature`` (:func:`signature`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from ._audio import Encoding, SampleFormat
from ._telephony import CallEvent, CallStart, EventReader, StreamEvents, connect_stream_document

RATE = 8_000
ENCODINGS = {"audio/x-mulaw": Encoding.PCMU, "audio/x-alaw": Encoding.PCMA}  # Twilio's media types
SIGNATURE_HEADER = "X-Twilio-Signature"
_read = EventReader("Twilio Media Streams")


class TwilioCarrier(StreamEvents):
    """One Twilio stream (a :class:`~pplex_trio.protocol.telephony.Carrier`): parse its events, build ours."""

    name: ClassVar[str] = "twilio"
    stream_key: ClassVar[str | None] = "streamSid"

    def parse(self, message: bytes | str) -> CallEvent | None:
        """The event one Twilio message carries: the caller's audio (inbound track only), the start, or a common event;
        None for others.
        """
        event = _read.load(message)
        kind = event["event"]
        if kind == "media":
            return _read.audio(event)
        if kind == "start":
            return self._start(event)
        return _read.common(event, kind)  # (else None: an event Twilio may add later)

    def _start(self, event: Mapping[str, Any]) -> CallStart:
        start = _read.object(event, "start")
        stream_sid = _read.text(start, "streamSid", "start")
        parameters = _read.parameters(start, "customParameters", "start")
        media_format = _read.media_format(start, "mediaFormat", {"encoding": "audio/x-mulaw", "sampleRate": RATE})
        encoding = ENCODINGS.get(str(media_format.get("encoding")))
        if encoding is None or media_format.get("sampleRate", RATE) != RATE or media_format.get("channels", 1) != 1:
            raise _read.unsupported(media_format, f"mono audio/x-mulaw or audio/x-alaw at {RATE} Hz")
        self.stream_id = stream_sid
        return CallStart(
            call_id=_read.optional_text(start, "callSid") or "",
            stream_id=stream_sid,
            account_id=_read.optional_text(start, "accountSid"),
            parameters=parameters,
            audio_format=SampleFormat(encoding, RATE),
        )


def answer_document(stream_url: str, parameters: Mapping[str, str]) -> str:
    """The TwiML that connects a call to the stream at ``stream_url``, handing it ``parameters``
    (``customParameters`` in its start event).

    Raises :class:`ProtocolError` (``param``: the parameter) for a value XML cannot carry.
    """
    return connect_stream_document(stream_url, parameters)


def signature(auth_token: str, url: str, params: Iterable[tuple[str, str]] = ()) -> str:
    """``X-Twilio-Signature`` of a request to ``url`` (the full URL Twilio asked for, query included) with the
    form ``params`` of a POST: base64 of HMAC-SHA1, keyed with the account's auth token, over the URL followed
    by each parameter's name and value, sorted."""
    data = url + "".join(name + value for name, value in sorted(set(params)))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()).decode("ascii")


def signature_matches(given: str | None, auth_token: str, url: str, params: Iterable[tuple[str, str]] = ()) -> bool:
    """Whether ``given`` is Twilio's signature of this request (compared in constant time)."""
    expected = signature(auth_token, url, params)
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())
