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
import binascii
import hashlib
import hmac
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from .._conversation import CloseCode
from ._audio import Encoding, SampleFormat
from ._errors import ProtocolError
from ._telephony import CallAudio, CallConnected, CallDtmf, CallEvent, CallMark, CallStart, CallStop

RATE = 8_000
ENCODINGS = {"audio/x-mulaw": Encoding.PCMU, "audio/x-alaw": Encoding.PCMA}  # Twilio's media types
SIGNATURE_HEADER = "X-Twilio-Signature"
# Characters XML 1.0 cannot carry (most C0 controls): such a parameter cannot go into TwiML.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _malformed(what: str) -> ProtocolError:
    return ProtocolError(f"malformed Twilio Media Streams event: {what}", CloseCode.INVALID_PAYLOAD)


def _object(event: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = event.get(key)
    if not isinstance(value, dict):
        raise _malformed(f"'{key}' must be an object")
    return value


def _text(fields: Mapping[str, Any], key: str, where: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str):
        raise _malformed(f"{where}.{key} must be a string")
    return value


class TwilioCarrier:
    """One Twilio stream (a :class:`~pplex_trio.protocol.telephony.Carrier`): parse its events, build ours."""

    name: ClassVar[str] = "twilio"

    def __init__(self) -> None:
        self.stream_sid: str | None = None  # from the start event; our messages name it

    def parse(self, message: bytes | str) -> CallEvent | None:
        if isinstance(message, bytes):
            raise ProtocolError("binary frames are not part of Twilio Media Streams: its events are JSON text",
                                CloseCode.UNSUPPORTED_DATA)
        try:
            event = json.loads(message)
        except ValueError:
            raise _malformed("not JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("event"), str):
            raise _malformed("an event must be a JSON object with a string 'event'")
        kind = event["event"]
        if kind == "media":
            media = _object(event, "media")
            track = media.get("track")
            if track is not None and track != "inbound":
                return None  # (a stream that forks both tracks: only the caller's is heard)
            try:
                return CallAudio(base64.b64decode(_text(media, "payload", "media"), validate=True))
            except (binascii.Error, ValueError):
                raise _malformed("media.payload is not base64") from None
        if kind == "start":
            return self._start(event)
        if kind == "mark":
            return CallMark(_text(_object(event, "mark"), "name", "mark"))
        if kind == "dtmf":
            return CallDtmf(_text(_object(event, "dtmf"), "digit", "dtmf"))
        if kind == "stop":
            return CallStop()
        if kind == "connected":
            return CallConnected()
        return None  # an event Twilio may add later

    def _start(self, event: Mapping[str, Any]) -> CallStart:
        start = _object(event, "start")
        stream_sid = _text(start, "streamSid", "start")
        parameters = start.get("customParameters") or {}
        if not isinstance(parameters, dict) or not all(isinstance(v, str) for v in parameters.values()):
            raise _malformed("start.customParameters must be an object of strings")
        media_format = start.get("mediaFormat") or {"encoding": "audio/x-mulaw", "sampleRate": RATE}
        if not isinstance(media_format, dict):
            raise _malformed("start.mediaFormat must be an object")
        encoding = ENCODINGS.get(str(media_format.get("encoding")))
        if encoding is None or media_format.get("sampleRate", RATE) != RATE or media_format.get("channels", 1) != 1:
            raise ProtocolError(f"unsupported media format {json.dumps(media_format)[:120]}: this server takes "
                                f"mono audio/x-mulaw or audio/x-alaw at {RATE} Hz", CloseCode.UNSUPPORTED_DATA)
        self.stream_sid = stream_sid
        call_sid, account_sid = start.get("callSid"), start.get("accountSid")
        return CallStart(call_id=call_sid if isinstance(call_sid, str) else "", stream_id=stream_sid,
                         account_id=account_sid if isinstance(account_sid, str) else None,
                         parameters=parameters, audio_format=SampleFormat(encoding, RATE))

    # -- our messages -------------------------------------------------------------

    def _message(self, kind: str, **fields: Any) -> str:
        assert self.stream_sid is not None, "the stream has not started"
        return json.dumps({"event": kind, "streamSid": self.stream_sid, **fields}, separators=(",", ":"))

    def media(self, audio: bytes) -> str:
        return self._message("media", media={"payload": base64.b64encode(audio).decode("ascii")})

    def clear(self) -> str:
        return self._message("clear")

    def mark(self, name: str) -> str:
        return self._message("mark", mark={"name": name})


def answer_document(stream_url: str, parameters: Mapping[str, str]) -> str:
    """The TwiML that connects a call to the stream at ``stream_url``, handing it ``parameters``
    (``customParameters`` in its start event).

    Raises :class:`ProtocolError` (``param``: the parameter) for a value XML cannot carry.
    """
    response = ET.Element("Response")
    stream = ET.SubElement(ET.SubElement(response, "Connect"), "Stream", url=stream_url)
    for name, value in parameters.items():
        if _NOT_XML.search(value):
            raise ProtocolError(f"{name} has control characters, which TwiML cannot carry", param=name)
        ET.SubElement(stream, "Parameter", name=name, value=value)
    return '<?xml version="1.0" encoding="UTF-8"?>' + ET.tostring(response, encoding="unicode")


def signature(auth_token: str, url: str, params: Iterable[tuple[str, str]] = ()) -> str:
    """``X-Twilio-Signature`` of a request to ``url`` (the full URL Twilio asked for, query included) with the
    form ``params`` of a POST: base64 of HMAC-SHA1, keyed with the account's auth token, over the URL followed
    by each parameter's name and value, sorted."""
    data = url + "".join(name + value for name, value in sorted(set(params)))
    return base64.b64encode(hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()).decode("ascii")


def signature_matches(given: str | None, auth_token: str, url: str,
                      params: Iterable[tuple[str, str]] = ()) -> bool:
    """Whether ``given`` is Twilio's signature of this request (compared in constant time)."""
    expected = signature(auth_token, url, params)
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())
