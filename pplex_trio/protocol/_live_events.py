"""The OpenAI Live protocol's server events as JSON text (sans-IO): one :class:`LiveEvents` per connection.

Every event but the output audio's carries a fresh ``event_id``; an answer to a client's
event carries its id as ``client_event_id``.  Times (``start_ms``, ``end_ms``) are on the
session timeline, which the session adapter keeps.
"""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

from ._errors import EventError
from ._live import LiveConfig

CLOSE_REASONS = frozenset({"close_requested", "expired", "remote_hangup", "connection_lost"})


class LiveEvents:
    """Builds one connection's server events, with fresh ids."""

    def __init__(self, *, session_id: str, expires_at: int):
        self._ids = itertools.count(1)
        self.session_id = session_id
        self.expires_at = expires_at
        self.resume_token: str | None = None  # the session object carries it once given (a resumable call)

    def _event(self, kind: str, client_event_id: str | None = None, **fields: Any) -> str:
        event = {"type": kind, "event_id": f"event_{next(self._ids):06d}", **fields}
        if client_event_id is not None:
            event["client_event_id"] = client_event_id
        return json.dumps(event, separators=(",", ":"))

    def session(self, config: LiveConfig) -> dict[str, Any]:
        """The session object the Live events carry: its id, expiry, model, instructions and audio settings (and our
        ``resume_token`` once there is one: the SDK's session model takes fields beyond its own)."""
        audio_format = {"type": config.audio_format.encoding.value, "rate": config.audio_format.rate}
        return {
            "id": self.session_id,
            "expires_at": self.expires_at,
            "model": config.model,
            "status": "active",
            "instructions": config.instructions,
            "audio": {"format": audio_format, "output": {"voice": config.voice}},
            **({} if self.resume_token is None else {"resume_token": self.resume_token}),
        }

    def started(self, config: LiveConfig, client_event_id: str | None) -> str:
        """``session.started``, with the session, answering the client's ``session.start``."""
        return self._event("session.started", client_event_id, session=self.session(config))

    def closed(self, reason: str, config: LiveConfig, seconds: float, client_event_id: str | None) -> str:
        """``session.closed`` with one of ``CLOSE_REASONS``, the session and the seconds used."""
        assert reason in CLOSE_REASONS
        return self._event(
            "session.closed", client_event_id, reason=reason, session=self.session(config), usage={"seconds": seconds}
        )

    def usage(self, seconds: float) -> str:
        """``session.usage.updated``: the session's seconds so far."""
        return self._event("session.usage.updated", usage={"seconds": seconds})

    def muted(self, muted: bool, client_event_id: str | None) -> str:
        """``session.input_audio.muted`` or ``.unmuted``, answering the client's mute."""
        return self._event("session.input_audio.muted" if muted else "session.input_audio.unmuted", client_event_id)

    def info(self, code: str, message: str) -> str:
        """An ``info`` event: a notice that ends nothing."""
        return self._event("info", code=code, message=message)

    def error(
        self,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str = "invalid_value",
        param: str | None = None,
        client_event_id: str | None = None,
    ) -> str:
        """An ``error`` event; with ``client_event_id``, it names the client's event it answers."""
        error: dict[str, Any] = {"type": kind, "code": code, "message": message, "param": param}
        if client_event_id is not None:
            error["client_event_id"] = client_event_id
        return self._event("error", client_event_id, error=error)

    def error_from(self, exc: EventError) -> str:
        """The ``error`` event for a client event the parser refused."""
        return self.error(exc.message, kind=exc.kind, code=exc.code, param=exc.param, client_event_id=exc.event_id)

    def audio_delta(self, audio: bytes) -> str:
        """``session.output_audio.delta`` with ``audio`` (in the session's format) as base64; the one event without an
        ``event_id``.
        """
        # (no event_id: the protocol's one event without, and the most frequent)
        return json.dumps(
            {"type": "session.output_audio.delta", "delta": base64.b64encode(audio).decode("ascii")},
            separators=(",", ":"),
        )

    def input_transcript_delta(self, text: str, start_ms: int, end_ms: int) -> str:
        """``session.input_transcript.delta``: a piece of the caller's words, placed on the session timeline (ms)
        where the caller said it."""
        return self._event("session.input_transcript.delta", delta=text, start_ms=start_ms, end_ms=end_ms)

    def transcript_delta(self, text: str, start_ms: int, end_ms: int) -> str:
        """``session.output_transcript.delta``: a piece of the agent's text, placed on the session timeline (ms)."""
        return self._event("session.output_transcript.delta", delta=text, start_ms=start_ms, end_ms=end_ms)
