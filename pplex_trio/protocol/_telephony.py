"""What a phone carrier's media stream says, in words common to every carrier (sans-IO).

Twilio, Telnyx, Plivo and Exotel each stream a call over a WebSocket as JSON
events with base64 audio (G.711 or 16-bit PCM) at 8 kHz; they differ in names
and shapes.  A carrier module (``_twilio.py``, ``_telnyx.py``, ``_plivo.py``,
``_exotel.py``) turns its events into these and builds its own outbound
messages (:class:`Carrier`), so the server's telephony session is written once
for all of them.  The helpers below are what the carrier modules share: reading
a JSON event and its fields, and the TwiML-like answer document that Twilio
and Telnyx both take.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from .._conversation import CloseCode
from ._audio import SampleFormat
from ._errors import ProtocolError

# Characters XML 1.0 cannot carry (most C0 controls): such a parameter cannot go into an XML answer.
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


@dataclasses.dataclass(frozen=True)
class CallConnected:
    """The carrier opened the stream (before its start)."""


@dataclasses.dataclass(frozen=True)
class CallStart:
    """The call's stream starts: who it is, the parameters the answer document gave it, its audio format."""

    call_id: str
    stream_id: str
    account_id: str | None
    parameters: Mapping[str, str]  # the answer document's (persona, voice, token)
    audio_format: SampleFormat  # the caller's audio (and ours, unless reply_format says otherwise)
    reply_format: SampleFormat | None = None  # what the carrier plays, when it differs (Telnyx: its RTP codec)


@dataclasses.dataclass(frozen=True)
class CallAudio:
    """A chunk of the caller's audio (20 ms on Twilio, Telnyx and Plivo, 100 ms on Exotel), in the call's format."""

    audio: bytes


@dataclasses.dataclass(frozen=True)
class CallMark:
    """The carrier has played our audio up to the mark of this name (or dropped it on a clear)."""

    name: str


@dataclasses.dataclass(frozen=True)
class CallDtmf:
    """The caller pressed a key."""

    digit: str


@dataclasses.dataclass(frozen=True)
class CallStop:
    """The call is over: the caller hung up, or the carrier ended the stream."""


CallEvent = CallConnected | CallStart | CallAudio | CallMark | CallDtmf | CallStop


class Carrier(Protocol):
    """One call's stream as a carrier speaks it: its events in, our messages out.

    ``parse`` raises :class:`~pplex_trio.protocol.ProtocolError` for a message
    that is not the carrier's (1003 for a binary frame, 1007 for a malformed
    event) and returns None for an event the session has no use for.  The
    builders may be called only after ``parse`` has returned the
    :class:`CallStart` (the outbound messages name the stream).
    """

    name: ClassVar[str]  # the session's protocol label: twilio, telnyx, …

    def parse(self, message: bytes | str) -> CallEvent | None:
        """The call event one message of the carrier's carries (None: one the session has no use for)."""

    def media(self, audio: bytes) -> str:
        """The message that sends ``audio``, our audio in the call's format."""

    def clear(self) -> str:
        """The message that drops what the carrier has buffered of our audio (barge-in)."""

    def mark(self, name: str) -> str:
        """The message asking the carrier to echo ``name`` back once what was sent before it has played."""


# -- what the carrier modules share ------------------------------------------------------------


class StreamEvents:
    """Our messages on a carrier's stream as Twilio shapes them, which Telnyx and Exotel follow: JSON events
    ``{"event": kind, <stream_key>: <the stream's id>, ...}`` (``media`` with its payload, ``clear``, ``mark``).
    A carrier sets :attr:`stream_id` from its start event and overrides what it names otherwise (Plivo)."""

    stream_key: ClassVar[str | None]  # the field that names the stream in our events (None: not named)

    def __init__(self) -> None:
        self.stream_id: str | None = None  # from the start event

    def _message(self, kind: str, **fields: Any) -> str:
        assert self.stream_id is not None, "the stream has not started"
        named = {self.stream_key: self.stream_id} if self.stream_key else {}
        return json.dumps({"event": kind, **named, **fields}, separators=(",", ":"))

    def media(self, audio: bytes) -> str:
        """A ``media`` message with ``audio`` as base64, naming the stream."""
        return self._message("media", media={"payload": base64.b64encode(audio).decode("ascii")})

    def clear(self) -> str:
        """A ``clear`` message: the carrier drops the audio of ours it has buffered (barge-in)."""
        return self._message("clear")

    def mark(self, name: str) -> str:
        """A ``mark`` message named ``name``; the carrier echoes it once what was sent before it has played."""
        return self._message("mark", mark={"name": name})


class EventReader:
    """Reads one carrier's JSON events, with errors that name the carrier (``label``: its stream's name).

    ``inbound``: the names the carrier gives the caller's track in ``media.track`` (see :meth:`audio`).
    """

    def __init__(self, label: str, inbound: tuple[str, ...] = ("inbound",)):
        self.label = label
        self.inbound = inbound

    def malformed(self, what: str) -> ProtocolError:
        """A :class:`ProtocolError` (1007) for a malformed event of this carrier, saying ``what``."""
        return ProtocolError(f"malformed {self.label} event: {what}", CloseCode.INVALID_PAYLOAD)

    def load(self, message: bytes | str) -> dict[str, Any]:
        """The event: a JSON object with a string ``event`` (1003 for a binary frame, 1007 for anything else)."""
        if isinstance(message, bytes):
            raise ProtocolError(
                f"binary frames are not part of {self.label}: its events are JSON text", CloseCode.UNSUPPORTED_DATA
            )
        try:
            event = json.loads(message)
        except ValueError:
            raise self.malformed("not JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("event"), str):
            raise self.malformed("an event must be a JSON object with a string 'event'")
        return event

    def object(self, event: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        """``event[key]``, which must be a JSON object (else a malformed-event error, 1007)."""
        value = event.get(key)
        if not isinstance(value, dict):
            raise self.malformed(f"'{key}' must be an object")
        return value

    def text(self, fields: Mapping[str, Any], key: str, where: str) -> str:
        """``fields[key]``, which must be a string (else 1007, naming ``where.key``)."""
        value = fields.get(key)
        if not isinstance(value, str):
            raise self.malformed(f"{where}.{key} must be a string")
        return value

    def optional_text(self, fields: Mapping[str, Any], *keys: str) -> str | None:
        """The first of ``keys`` that is a string (carriers name their ids differently), or None."""
        for key in keys:
            if isinstance(fields.get(key), str):
                return str(fields[key])
        return None

    def payload(self, media: Mapping[str, Any], sample_bytes: int = 1) -> bytes:
        """``media.payload``: base64 of whole samples."""
        try:
            audio = base64.b64decode(self.text(media, "payload", "media"), validate=True)
        except (binascii.Error, ValueError):
            raise self.malformed("media.payload is not base64") from None
        if len(audio) % sample_bytes:
            raise self.malformed("media.payload must be whole 16-bit samples (an even number of bytes)")
        return audio

    def audio(self, event: Mapping[str, Any], sample_bytes: int = 1) -> CallAudio | None:
        """A ``media`` event's audio (``media.payload``), or None when ``media.track`` names another track than
        the caller's: a stream that forks both tracks is heard on the caller's only."""
        media = self.object(event, "media")
        track = media.get("track")
        if track is not None and track not in self.inbound:
            return None
        return CallAudio(self.payload(media, sample_bytes))

    def common(self, event: Mapping[str, Any], kind: str, *, marks: bool = True) -> CallEvent | None:
        """The events most carriers send alike: ``mark`` (``mark.name``; ``marks=False`` for a carrier that
        echoes marks its own way), ``dtmf`` (``dtmf.digit``), ``stop``, ``connected``; None for the rest."""
        if kind == "mark" and marks:
            return CallMark(self.text(self.object(event, "mark"), "name", "mark"))
        if kind == "dtmf":
            return CallDtmf(self.text(self.object(event, "dtmf"), "digit", "dtmf"))
        if kind == "stop":
            return CallStop()
        if kind == "connected":
            return CallConnected()
        return None

    def media_format(self, start: Mapping[str, Any], key: str, default: Mapping[str, Any]) -> Mapping[str, Any]:
        """``start[key]``, the stream's audio format (``default`` when absent)."""
        media_format = start.get(key) or default
        if not isinstance(media_format, dict):
            raise self.malformed(f"start.{key} must be an object")
        return media_format

    def unsupported(self, media_format: Mapping[str, Any], takes: str) -> ProtocolError:
        """A format the server does not take (1003), with what it does take."""
        return ProtocolError(
            f"unsupported media format {json.dumps(media_format)[:120]}: this server takes {takes}",
            CloseCode.UNSUPPORTED_DATA,
        )

    def parameters(self, fields: Mapping[str, Any], key: str, where: str) -> Mapping[str, str]:
        """``fields[key]``: an object of string values, or ``{}`` when absent (else 1007)."""
        parameters = fields.get(key) or {}
        if not isinstance(parameters, dict) or not all(isinstance(v, str) for v in parameters.values()):
            raise self.malformed(f"{where}.{key} must be an object of strings")
        return parameters


def connect_stream_document(stream_url: str, parameters: Mapping[str, str], **attributes: str) -> str:
    """``<Response><Connect><Stream url=…>`` with a ``<Parameter>`` for each of ``parameters``: the answer
    of Twilio (TwiML) and Telnyx (TeXML), whose stream hands them back in its start event.

    Raises :class:`ProtocolError` (``param``: the parameter) for a value XML cannot carry.
    """
    response = ET.Element("Response")
    stream = ET.SubElement(ET.SubElement(response, "Connect"), "Stream", {"url": stream_url, **attributes})
    for name, value in parameters.items():
        if NOT_XML.search(value):
            raise ProtocolError(f"{name} has control characters, which the answer document cannot carry", param=name)
        ET.SubElement(stream, "Parameter", name=name, value=value)
    return '<?xml version="1.0" encoding="UTF-8"?>' + ET.tostring(response, encoding="unicode")
