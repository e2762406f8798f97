"""A running server's voices over HTTP: list, add (a clip), remove; what ``pplex-trio voice`` calls.

Plain blocking HTTP (``urllib``): one request each, nothing to stream.  A
refusal comes back as :class:`VoiceApiError` with the server's status and
its message in words.
"""

from __future__ import annotations

import json
import pathlib
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

CONTENT_TYPES = {".wav": "audio/wav", ".flac": "audio/flac", ".mp3": "audio/mpeg", ".ogg": "audio/ogg"}


class VoiceApiError(Exception):
    """The server refused a voice request: its HTTP ``status`` and ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def list_voices(url: str, *, token: str | None = None, ssl_context: ssl.SSLContext | None = None) -> dict[str, Any]:
    """``GET /api/voices``: ``{"voices": [...], "added": [...], "uploads": bool}``."""
    return _request("GET", _api(url, "/api/voices"), token=token, ssl_context=ssl_context)


def add_voice(
    url: str, clip: pathlib.Path, name: str, *, token: str | None = None, ssl_context: ssl.SSLContext | None = None
) -> dict[str, Any]:
    """``POST /api/voices?name=NAME`` with the clip: ``{"voice": "NAME.pt", "seconds": …}``.

    Error handling: ``ValueError`` for a clip whose kind the server does not
    take (by its suffix), ``OSError`` for one that cannot be read,
    :class:`VoiceApiError` for the server's refusal.
    """
    kind = CONTENT_TYPES.get(clip.suffix.lower())
    if kind is None:
        raise ValueError(f"{clip.name}: give a .wav, .flac, .mp3 or .ogg clip")
    query = urllib.parse.urlencode({"name": name})
    return _request(
        "POST",
        _api(url, f"/api/voices?{query}"),
        body=clip.read_bytes(),
        content_type=kind,
        token=token,
        ssl_context=ssl_context,
    )


def remove_voice(
    url: str, name: str, *, token: str | None = None, ssl_context: ssl.SSLContext | None = None
) -> dict[str, Any]:
    """``DELETE /api/voices/NAME``: ``{"deleted": "NAME.pt"}``."""
    return _request(
        "DELETE", _api(url, "/api/voices/" + urllib.parse.quote(name, safe="")), token=token, ssl_context=ssl_context
    )


def _api(url: str, path: str) -> str:
    parts = urllib.parse.urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not a server address such as http://127.0.0.1:8998")
    return f"{scheme}://{parts.netloc}{path}"


def _request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    content_type: str | None = None,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> dict[str, Any]:
    request = urllib.request.Request(url, data=body, method=method)
    if content_type is not None:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=180, context=ssl_context) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            message = json.loads(raw).get("error") or exc.reason
        except (ValueError, AttributeError):
            message = raw.decode("utf-8", "replace")[:200] or exc.reason
        raise VoiceApiError(exc.code, str(message)) from None
