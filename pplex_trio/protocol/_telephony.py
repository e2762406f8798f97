"""What a phone carrier's media stream says, in words common to every carrier (sans-IO).

Twilio, Telnyx, Plivo and Exotel each stream a call over a WebSocket as JSON
events with base64 G.711 audio at 8 kHz; they differ in names and shapes.  A
carrier module (``_twilio.py``) turns its events into these and builds its own
outbound messages (:class:`Carrier`), so the server's telephony session is
written once for all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Protocol

from ._audio import SampleFormat


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
    audio_format: SampleFormat  # G.711 at 8 kHz, both ways


@dataclasses.dataclass(frozen=True)
class CallAudio:
    """A chunk of the caller's audio (20 ms on Twilio), in the call's format."""

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

    def parse(self, message: bytes | str) -> CallEvent | None: ...
    def media(self, audio: bytes) -> str: ...  # our audio, in the call's format
    def clear(self) -> str: ...  # drop what the carrier has buffered of our audio (barge-in)
    def mark(self, name: str) -> str: ...  # echo ``name`` back once what was sent before it has played
