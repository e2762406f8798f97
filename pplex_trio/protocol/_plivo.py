"""Plivo audio streams, sans-IO: the stream's events, our messages, the Plivo XML answer, the signature.

A call answered with ``<Stream bidirectional="true" keepCallAlive="true">wss://…/telephony/plivo?…</Stream>``
opens a bidirectional stream: Plivo sends ``start`` (``callId``, ``streamId``,
``mediaFormat``: μ-law at 8 kHz, or 16-bit linear PCM at 8 or 16 kHz, and the
answer's ``extraHeaders``), then ``media`` (base64, 20 ms), ``dtmf``,
``playedStream`` when what we sent before a ``checkpoint`` has played,
``clearedAudio`` after our ``clearAudio``, and ``stop`` when the call ends.
We send ``playAudio``, ``checkpoint`` and ``clearAudio``, each naming the
stream.  Plivo's ``extraHeaders`` are ``key=value`` pairs joined by commas,
which a persona cannot safely be; so the answer puts persona, voice and token
in the stream URL's query, and a start event's extra headers, when given,
override them.  Plivo signs its requests to the answer URL with
``X-Plivo-Signature-V3`` (:func:`signature`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from ._audio import Encoding, SampleFormat
from ._telephony import CallEvent, CallMark, CallStart, EventReader, StreamEvents

# Plivo's content types, and the rates each may stream at.
FORMATS = {
    ("audio/x-mulaw", 8_000): SampleFormat(Encoding.PCMU, 8_000),
    ("audio/x-l16", 8_000): SampleFormat(Encoding.PCM16, 8_000),
    ("audio/x-l16", 16_000): SampleFormat(Encoding.PCM16, 16_000),
}
CONTENT_TYPE = "audio/x-mulaw;rate=8000"  # what the answer asks for
SIGNATURE_HEADER = "X-Plivo-Signature-V3"
NONCE_HEADER = "X-Plivo-Signature-V3-Nonce"
_read = EventReader("Plivo audio streams")


def _extra_headers(value: Any) -> Mapping[str, str]:
    """The start event's extra headers: an object, a JSON object's text, or ``k=v,k=v`` (each shape is seen)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pairs = (item.partition("=") for item in value.split(",") if item)
            return {k.strip(): v.strip() for k, sep, v in pairs if sep}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _read.malformed("extra_headers must be an object of strings")
    return value


class PlivoCarrier(StreamEvents):
    """One Plivo stream (a :class:`~pplex_trio.protocol.telephony.Carrier`): parse its events, build ours."""

    name: ClassVar[str] = "plivo"
    stream_key: ClassVar[str | None] = "streamId"

    def __init__(self) -> None:
        super().__init__()
        self._format: tuple[str, int] = ("audio/x-mulaw", 8_000)

    def parse(self, message: bytes | str) -> CallEvent | None:
        """The event one Plivo message carries: the caller's audio (inbound track only), the start, ``playedStream`` as
        the mark's echo, or a common event; None for others.
        """
        event = _read.load(message)
        kind = event["event"]
        if kind == "media":
            return _read.audio(event, 2 if self._format[0] == "audio/x-l16" else 1)
        if kind == "start":
            return self._start(event)
        if kind == "playedStream":
            return CallMark(_read.text(event, "name", "playedStream"))
        return _read.common(event, kind, marks=False)  # (else None: clearedAudio, our clear's echo, and
        # events Plivo may add)

    def _start(self, event: Mapping[str, Any]) -> CallStart:
        start = _read.object(event, "start")
        stream_id = _read.optional_text(start, "streamId") or _read.optional_text(event, "streamId")
        if stream_id is None:
            raise _read.malformed("start.streamId must be a string")
        media_format = _read.media_format(start, "mediaFormat", {"encoding": "audio/x-mulaw", "sampleRate": 8_000})
        encoding, rate = str(media_format.get("encoding")), media_format.get("sampleRate", 8_000)
        audio_format = FORMATS.get((encoding, rate)) if type(rate) is int else None
        if audio_format is None:
            raise _read.unsupported(media_format, "audio/x-mulaw at 8000 Hz or audio/x-l16 at 8000 or 16000 Hz")
        headers = event.get("extra_headers", start.get("extraHeaders", event.get("extraHeaders")))
        self.stream_id, self._format = stream_id, (encoding, audio_format.rate)
        return CallStart(
            call_id=_read.optional_text(start, "callId") or "",
            stream_id=stream_id,
            account_id=_read.optional_text(start, "accountId"),
            parameters=_extra_headers(headers),
            audio_format=audio_format,
        )

    # -- our messages -------------------------------------------------------------

    def media(self, audio: bytes) -> str:
        """A ``playAudio`` message of ``audio``, labelled with the stream's content type and rate."""
        content_type, rate = self._format
        return self._message(
            "playAudio",
            media={"contentType": content_type, "sampleRate": rate, "payload": base64.b64encode(audio).decode("ascii")},
        )

    def clear(self) -> str:
        """A ``clearAudio`` message (barge-in)."""
        return self._message("clearAudio")

    def mark(self, name: str) -> str:
        """A ``checkpoint`` named ``name``; Plivo answers ``playedStream`` once what came before has played."""
        return self._message("checkpoint", name=name)


def answer_document(stream_url: str, parameters: Mapping[str, str]) -> str:
    """The Plivo XML that connects a call to a bidirectional stream at ``stream_url``, with ``parameters``
    in the URL's query (the session reads them there; see the module's docstring)."""
    response = ET.Element("Response")
    stream = ET.SubElement(response, "Stream", bidirectional="true", keepCallAlive="true", contentType=CONTENT_TYPE)
    stream.text = stream_url + ("?" + urllib.parse.urlencode(parameters) if parameters else "")
    return '<?xml version="1.0" encoding="UTF-8"?>' + ET.tostring(response, encoding="unicode")


def _signed_text(url: str, params: Iterable[tuple[str, str]]) -> str:
    # The URL without its query, then its query's pairs decoded and sorted (name=value, joined by &); for a POST
    # with a form, "?", the query, "." if there was one, and the form's pairs sorted (name and value run on).
    # (Plivo's SDK decodes the query as bytes and fails on a non-ASCII escape; this reads it as UTF-8.)
    parts = urllib.parse.urlparse(url)
    text = f"{parts.scheme}://{parts.netloc}{parts.path}"
    pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query = "&".join(f"{name}={value}" for name, value in sorted(pairs))
    form = "".join(name + value for name, value in sorted(params))
    if form:
        return f"{text}?{query}{'.' if query else ''}{form}"
    return f"{text}?{query}" if query else text


def signature(auth_token: str, url: str, nonce: str, params: Iterable[tuple[str, str]] = ()) -> str:
    """``X-Plivo-Signature-V3`` of a request to ``url`` (the full URL Plivo asked for, query included) with
    the form ``params`` of a POST and the ``X-Plivo-Signature-V3-Nonce`` ``nonce``: base64 of HMAC-SHA256,
    keyed with the (sub)account's auth token, over the URL with its query sorted, the form sorted, then
    ``.`` and the nonce."""
    data = f"{_signed_text(url, params)}.{nonce}".encode()
    return base64.b64encode(hmac.new(auth_token.encode(), data, hashlib.sha256).digest()).decode("ascii")


def signature_matches(
    given: str | None, nonce: str | None, auth_token: str, url: str, params: Iterable[tuple[str, str]] = ()
) -> bool:
    """Whether ``given`` (one signature, or several joined by commas) holds Plivo's signature of this
    request (each compared in constant time)."""
    if given is None or nonce is None:
        return False
    expected = signature(auth_token, url, nonce, params).encode()
    return any(hmac.compare_digest(one.encode("utf-8", "surrogateescape"), expected) for one in given.split(","))
