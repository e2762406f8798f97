"""The raw PCM protocol (``/v1/audio/duplex``), sans-IO.

Binary frames carry float32 little-endian mono PCM at 24 kHz, any length;
text frames carry small JSON control messages.  See ``docs/PROTOCOL.md``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from ._errors import CloseCode, ProtocolError

MAX_CONTROL_CHARS = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Open:
    """``{"type": "open", ...}``: the conversation settings (all optional)."""

    params: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Close:
    """``{"type": "close"}``: flush what is pending, answer ``done``, close."""


@dataclasses.dataclass(frozen=True)
class PcmReceived:
    """A binary frame's audio: float32 mono samples at 24 kHz, checked by :func:`decode_pcm`."""

    pcm: np.ndarray


ClientEvent = Open | Close | PcmReceived


def parse_client_message(message: bytes | str | None) -> ClientEvent:
    """Decode one client frame; raise :class:`ProtocolError` for bad input.

    (A message over the size limit never gets here: the inbound guard refuses it at its frame header.)
    """
    if message is None:
        message = b""
    if isinstance(message, str):
        return _parse_control(message)
    return PcmReceived(decode_pcm(message))


def decode_pcm(data: bytes) -> np.ndarray:
    """float32 little-endian samples, checked: whole samples, all finite."""
    if len(data) % 4:
        raise ProtocolError(
            f"PCM must be float32 little-endian: {len(data)} bytes is not a multiple of 4",
            CloseCode.INVALID_PAYLOAD,
        )
    pcm = np.frombuffer(data, dtype="<f4").astype(np.float32, copy=False)
    if pcm.size and not np.isfinite(pcm).all():
        raise ProtocolError("PCM contains NaN or infinite samples", CloseCode.INVALID_PAYLOAD)
    return pcm


def _parse_control(message: str) -> Open | Close:
    # A control message is small (a persona is at most a few thousand characters): anything much larger is
    # refused before the parser sees it, and nesting deep enough to exhaust the parser is refused too.
    if len(message) > MAX_CONTROL_CHARS:
        raise ProtocolError(
            f"a control message of {len(message)} characters is over the limit of {MAX_CONTROL_CHARS}",
            CloseCode.INVALID_PAYLOAD,
        )
    try:
        obj = json.loads(message)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"text frames must be JSON objects: {exc.msg}", CloseCode.INVALID_PAYLOAD) from None
    except RecursionError:
        raise ProtocolError("the JSON is nested too deeply: send a flat object", CloseCode.INVALID_PAYLOAD) from None
    if not isinstance(obj, dict):
        raise ProtocolError('text frames must be JSON objects with a "type"', CloseCode.INVALID_PAYLOAD)
    kind = obj.get("type")
    if kind == "open":
        return Open({k: v for k, v in obj.items() if k != "type"})
    if kind == "close":
        return Close()
    raise ProtocolError(f'unknown message type {kind!r:.40}: expected "open" or "close"', CloseCode.UNSUPPORTED_DATA)


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def ready(resume: str | None = None, *, resumed: bool = False, notice: str | None = None) -> str:
    """``{"type": "ready"}``: the system prompt has run; PCM sent before it is not lost.  ``resume``: the token
    that resumes this call after a dropped connection; ``resumed``: this connection resumed it; ``notice``:
    what the client should know (say, settings a resume ignored)."""
    extra = {"resume": resume, "resumed": resumed or None, "notice": notice}
    return _json({"type": "ready", **{k: v for k, v in extra.items() if v is not None}})


def queued(position: int) -> str:
    """``{"type": "queued", "position": n}``: waiting for a slot, ``position`` in line (1-based)."""
    return _json({"type": "queued", "position": position})


AGENT = "agent"
USER = "user"  # the caller (the word OpenAI's and Google's protocols use for that side)


def text(piece: str, speaker: str = AGENT) -> str:
    """``{"type": "text", "text": piece, "speaker": speaker}``: a piece of the agent's text, or with ``--transcribe``
    of the caller's words (``speaker``: :data:`AGENT` or :data:`USER`)."""
    return _json({"type": "text", "text": piece, "speaker": speaker})


def done() -> str:
    """``{"type": "done"}``: everything is out, the answer to a close."""
    return _json({"type": "done"})


def error(message: str) -> str:
    """``{"type": "error", "error": message}``, sent before the close."""
    return _json({"type": "error", "error": message})


def pcm_frame(pcm: np.ndarray) -> bytes:
    """A binary frame of ``pcm`` as float32 little-endian samples."""
    return np.ascontiguousarray(pcm, dtype="<f4").tobytes()
