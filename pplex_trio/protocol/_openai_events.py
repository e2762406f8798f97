"""What OpenAI's two protocols (Realtime, Live) share, sans-IO: a client event is a JSON text message, an object
with a string ``type`` and perhaps an ``event_id``, its audio base64."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from typing import Any

from .._conversation import CloseCode
from ._errors import EventError, ProtocolError


@dataclasses.dataclass(frozen=True)
class ClientEvent:
    """A client event as parsed: its ``type`` and ``event_id``; the subclasses add their fields."""

    type: str
    event_id: str | None


@dataclasses.dataclass(frozen=True)
class AudioAppend(ClientEvent):
    """``input_audio_buffer.append`` (Realtime) or ``session.input_audio.append`` (Live): the caller's audio."""

    audio: bytes  # decoded from base64, still in the session's format


def load_event(message: bytes | str, protocol: str) -> tuple[dict[str, Any], ClientEvent]:
    """One client message → its JSON object and its type and id; :class:`EventError` for what is not an event.

    Binary frames are not part of ``protocol`` (it is JSON text): a :class:`ProtocolError` (1003).
    A message over the size limit never gets here: the inbound guard refuses it at its frame header.
    """
    if isinstance(message, bytes):
        raise ProtocolError(
            f"binary frames are not part of the {protocol} protocol: send JSON events as text",
            CloseCode.UNSUPPORTED_DATA,
        )
    try:
        event = json.loads(message)
    except ValueError:
        raise EventError("the message is not valid JSON", code="invalid_json") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise EventError("an event must be a JSON object with a string 'type'", param="type", code="invalid_event")
    event_id = event.get("event_id")
    return event, ClientEvent(event["type"], event_id if isinstance(event_id, str) else None)


def audio_append(event: dict[str, Any], head: ClientEvent) -> AudioAppend:
    """An audio event's ``audio``, decoded from base64."""
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise EventError("audio must be a base64 string", param="audio", event_id=head.event_id)
    try:
        return AudioAppend(head.type, head.event_id, base64.b64decode(audio, validate=True))
    except (binascii.Error, ValueError):
        raise EventError("audio is not valid base64", param="audio", event_id=head.event_id) from None
