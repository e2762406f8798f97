"""The Moshi wire protocol (``/api/chat``), sans-IO.

Every message is one binary WebSocket frame: a kind byte, then the payload.
See ``docs/PROTOCOL.md``.  These functions turn client frames into events and
server events into frames; they know nothing of sockets or Opus.
"""

from __future__ import annotations

import dataclasses
import enum
import json

from ._errors import CloseCode, ProtocolError


class Kind(enum.IntEnum):
    """A Moshi frame's first byte: what its payload is."""

    HANDSHAKE = 0x00
    AUDIO = 0x01
    TEXT = 0x02
    CONTROL = 0x03
    METADATA = 0x04
    ERROR = 0x05
    PING = 0x06
    COLORED_TEXT = 0x07  # Kyutai's client only; the PersonaPlex client throws on it
    CALLER_TEXT = 0x10  # pplex-trio's own, only to a client that asked (?transcribe_caller=1): the caller's words
    RESUME = 0x11  # pplex-trio's own, only to a client that asked (?resumable=1): JSON with the resume token
    HANGUP = 0x12  # pplex-trio's own, client → server: the call is over (not a dropped connection to resume)


@dataclasses.dataclass(frozen=True)
class AudioReceived:
    """Ogg Opus bytes (whole pages or any split of them)."""

    ogg: bytes


@dataclasses.dataclass(frozen=True)
class HangupReceived:
    """``0x12``: the client ends the call for good (a resumable call is not paused for it)."""


@dataclasses.dataclass(frozen=True)
class Ignored:
    """A well-formed message the server does not act on (control, ping, unknown kinds)."""

    kind: int


ClientEvent = AudioReceived | HangupReceived | Ignored


def parse_client_message(message: bytes | str | None) -> ClientEvent:
    """Decode one client frame; raise :class:`ProtocolError` for bad input.

    Unknown kinds and ``0x03`` control messages are ignored, as Kyutai's
    protocol note asks: a newer client must not be cut off by an older server.
    (A message over the size limit never gets here: the inbound guard refuses
    it at its frame header, ``_ws_guard.py``.)
    """
    if isinstance(message, str):
        raise ProtocolError(
            "text frames are not part of the Moshi protocol: send binary frames (kind byte + payload)",
            CloseCode.UNSUPPORTED_DATA,
        )
    if not message:
        raise ProtocolError("empty message: every Moshi message starts with a kind byte", CloseCode.INVALID_PAYLOAD)
    kind = message[0]
    if kind == Kind.AUDIO:
        return AudioReceived(bytes(message[1:]))
    if kind == Kind.HANGUP:
        return HangupReceived()
    return Ignored(kind)


def handshake() -> bytes:
    """Tell the client its conversation is ready (official PersonaPlex form)."""
    return bytes([Kind.HANDSHAKE])


def audio(ogg: bytes) -> bytes:
    """The server frame carrying Ogg Opus pages of the agent's audio."""
    return bytes([Kind.AUDIO]) + ogg


def text(piece: str) -> bytes:
    """The server frame carrying one piece of the agent's text, UTF-8."""
    return bytes([Kind.TEXT]) + piece.encode("utf-8")


def caller_text(piece: str) -> bytes:
    """The server frame carrying one piece of the caller's words, UTF-8 (pplex-trio's kind, asked for)."""
    return bytes([Kind.CALLER_TEXT]) + piece.encode("utf-8")


def resume(token: str, *, resumed: bool = False, notice: str | None = None) -> bytes:
    """The server frame carrying the token that resumes this call, as UTF-8 JSON ``{"token": ...}`` (with
    ``"resumed": true`` on a connection that resumed it, and ``"notice"`` when the client should know something)."""
    extra = {"resumed": resumed or None, "notice": notice}
    body = {"token": token, **{k: v for k, v in extra.items() if v is not None}}
    return bytes([Kind.RESUME]) + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def hangup() -> bytes:
    """The client frame that ends the call for good (``0x12``, no payload)."""
    return bytes([Kind.HANGUP])


def error(message: str) -> bytes:
    """The server frame carrying an error message (UTF-8), sent before the close."""
    return bytes([Kind.ERROR]) + message.encode("utf-8")


def ping() -> bytes:
    """The server's keepalive frame: the kind byte alone."""
    return bytes([Kind.PING])
