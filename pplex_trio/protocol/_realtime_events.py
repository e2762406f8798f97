"""The OpenAI Realtime protocol's server events, in either dialect, as JSON text (sans-IO).

The facts are the same in both dialects; a :class:`ServerEvents` writes them
in its connection's shape (beta names a few audio events differently, and its
session and response objects are flatter).  The conversation's items are
``_realtime_items.py``'s; the client's events ``_realtime.py``'s.
"""

from __future__ import annotations

import base64
import itertools
import json
import secrets
from typing import Any

from ._errors import EventError
from ._realtime import AudioFormat, Dialect, SessionConfig

# GA names, and beta's where they differ.
_BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
}
TURN_DETECTION = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": 0,
    "silence_duration_ms": 480,
    "create_response": False,
    "interrupt_response": False,
}


class ServerEvents:
    """Builds one connection's server events as JSON text, in its dialect, with fresh ids."""

    def __init__(self, dialect: Dialect, *, model: str):
        self.dialect = dialect
        self.model = model
        self._ids = itertools.count(1)
        self.session_id = f"sess_{secrets.token_hex(12)}"  # (unique: a resumed session is known by it)
        self.resume_token: str | None = None  # the session object carries it once given (a resumable call)

    def carry_on(self, previous: ServerEvents) -> None:
        """This connection resumed ``previous``'s session: its id, and ids that go on from its."""
        self.session_id, self._ids = previous.session_id, previous._ids

    def new_id(self, prefix: str) -> str:
        """A fresh id for this connection, ``<prefix>_000001`` and on (``sess``, ``item``, ``resp``, ...)."""
        return f"{prefix}_{next(self._ids):06d}"

    def _event(self, kind: str, **fields: Any) -> str:
        if self.dialect is Dialect.BETA:
            kind = _BETA_NAMES.get(kind, kind)
        return json.dumps({"type": kind, "event_id": self.new_id("event"), **fields}, separators=(",", ":"))

    # -- the session

    def session(self, config: SessionConfig) -> dict[str, Any]:
        """The session object of ``session.created`` / ``session.updated`` in the connection's dialect (with
        our ``resume_token`` once there is one: the SDK's session models take fields beyond theirs)."""
        session = self._session(config)
        return session if self.resume_token is None else {**session, "resume_token": self.resume_token}

    def _session(self, config: SessionConfig) -> dict[str, Any]:
        if self.dialect is Dialect.BETA:
            # (beta's session model names only OpenAI's models: ours is left out, as the schema allows)
            return {
                "id": self.session_id,
                "object": "realtime.session",
                "modalities": ["audio", "text"],
                "instructions": config.instructions,
                "voice": config.voice,
                "input_audio_format": config.input_format.beta,
                "output_audio_format": config.output_format.beta,
                "input_audio_transcription": config.transcription,
                "turn_detection": TURN_DETECTION,
                "tools": [],
                "tool_choice": "auto",
                "temperature": config.temperature,
                "max_response_output_tokens": "inf",
                "speed": 1.0,
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.session_id,
            "model": self.model,
            "output_modalities": ["audio"],
            "instructions": config.instructions,
            "audio": {
                "input": {
                    "format": _ga_format(config.input_format),
                    "transcription": config.transcription,
                    "noise_reduction": None,
                    "turn_detection": TURN_DETECTION,
                },
                "output": {"format": _ga_format(config.output_format), "voice": config.voice, "speed": 1.0},
            },
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf",
            "tracing": None,
            "truncation": "auto",
            "prompt": None,
        }

    def session_created(self, config: SessionConfig) -> str:
        """``session.created``: the first event of a connection, with its session."""
        return self._event("session.created", session=self.session(config))

    def session_updated(self, config: SessionConfig) -> str:
        """``session.updated``: the session as it stands after a ``session.update``."""
        return self._event("session.updated", session=self.session(config))

    def error(
        self,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        event_id: str | None = None,
    ) -> str:
        """An ``error`` event; ``event_id`` names the client event it answers, when there is one."""
        return self._event(
            "error", error={"type": kind, "code": code, "message": message, "param": param, "event_id": event_id}
        )

    def error_from(self, exc: EventError) -> str:
        """The ``error`` event for a client event the parser refused."""
        return self.error(exc.message, kind=exc.kind, code=exc.code, param=exc.param, event_id=exc.event_id)

    # -- input

    def committed(self, item_id: str, previous_item_id: str | None) -> str:
        """``input_audio_buffer.committed``: the caller's audio so far became item ``item_id``."""
        return self._event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous_item_id)

    def cleared(self) -> str:
        """``input_audio_buffer.cleared``, answering the client's clear."""
        return self._event("input_audio_buffer.cleared")

    def speech_started(self, audio_start_ms: int, item_id: str) -> str:
        """``input_audio_buffer.speech_started``, at ``audio_start_ms`` of the caller's audio."""
        return self._event("input_audio_buffer.speech_started", audio_start_ms=audio_start_ms, item_id=item_id)

    def speech_stopped(self, audio_end_ms: int, item_id: str) -> str:
        """``input_audio_buffer.speech_stopped``, at ``audio_end_ms`` of the caller's audio."""
        return self._event("input_audio_buffer.speech_stopped", audio_end_ms=audio_end_ms, item_id=item_id)

    def input_transcript_delta(self, item_id: str, text: str) -> str:
        """``conversation.item.input_audio_transcription.delta``: a piece of the caller's words in item ``item_id``."""
        return self._event(
            "conversation.item.input_audio_transcription.delta", item_id=item_id, content_index=0, delta=text
        )

    def input_transcript_completed(self, item_id: str, transcript: str, seconds: float) -> str:
        """``conversation.item.input_audio_transcription.completed``: the caller's words of item ``item_id``
        (``seconds``: the audio they cover, as the usage)."""
        return self._event(
            "conversation.item.input_audio_transcription.completed",
            item_id=item_id,
            content_index=0,
            transcript=transcript,
            usage={"type": "duration", "seconds": round(seconds, 3)},
        )

    def transcription_session_updated(self, config: SessionConfig) -> str:
        """Beta's ``transcription_session.updated``, answering a ``transcription_session.update`` (this server's
        sessions have no ephemeral key: the secret is empty)."""
        return self._event(
            "transcription_session.updated",
            session={
                "client_secret": {"value": "", "expires_at": 0},
                "input_audio_format": config.input_format.beta,
                "input_audio_transcription": config.transcription,
                "modalities": ["audio", "text"],
                "turn_detection": TURN_DETECTION,
            },
        )

    def user_item(self, item_id: str, transcript: str | None) -> dict[str, Any]:
        """The caller's audio item (a user message), with its words once they are complete."""
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": transcript}],
        }

    def output_cleared(self, response_id: str) -> str:
        """``output_audio_buffer.cleared``: the response's audio not yet sent was dropped (barge-in)."""
        return self._event("output_audio_buffer.cleared", response_id=response_id)

    # -- conversation items

    def item_added(self, previous_item_id: str | None, item: dict[str, Any]) -> list[str]:
        """The events announcing a new item: GA's ``conversation.item.added`` and ``.done``, or beta's ``.created``."""
        if self.dialect is Dialect.BETA:
            return [self._event("conversation.item.created", previous_item_id=previous_item_id, item=item)]
        return [
            self._event("conversation.item.added", previous_item_id=previous_item_id, item=item),
            self._event("conversation.item.done", previous_item_id=previous_item_id, item=item),
        ]

    def item_truncated(self, item_id: str, content_index: int, audio_end_ms: int) -> str:
        """``conversation.item.truncated``: the item's audio counts as played up to ``audio_end_ms``."""
        return self._event(
            "conversation.item.truncated", item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms
        )

    def item_deleted(self, item_id: str) -> str:
        """``conversation.item.deleted``, answering the client's delete."""
        return self._event("conversation.item.deleted", item_id=item_id)

    def item_retrieved(self, item: dict[str, Any]) -> str:
        """``conversation.item.retrieved`` with the item as kept."""
        return self._event("conversation.item.retrieved", item=item)

    # -- a response: created, its one audio item and part, deltas, then done

    def item(self, item_id: str, status: str, transcript: str | None) -> dict[str, Any]:
        """The model's audio item (an assistant message) in the dialect's shape; no content until it has a
        transcript."""
        content = {"type": "output_audio" if self.dialect is Dialect.GA else "audio", "transcript": transcript}
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [] if transcript is None else [content],
        }

    def _response(
        self,
        response_id: str,
        status: str,
        config: SessionConfig,
        output: list[dict[str, Any]],
        metadata: dict[str, str] | None,
    ) -> dict[str, Any]:
        base = {
            "id": response_id,
            "object": "realtime.response",
            "status": status,
            "status_details": None,
            "output": output,
            "conversation_id": None,
            "usage": None,
            "metadata": metadata,
        }
        if self.dialect is Dialect.BETA:
            return {
                **base,
                "modalities": ["audio", "text"],
                "voice": config.voice,
                "output_audio_format": config.output_format.beta,
                "max_output_tokens": "inf",
            }
        return {
            **base,
            "output_modalities": ["audio"],
            "max_output_tokens": "inf",
            "audio": {"output": {"format": _ga_format(config.output_format), "voice": config.voice}},
        }

    def response_started(
        self, response_id: str, item_id: str, config: SessionConfig, metadata: dict[str, str] | None = None
    ) -> list[str]:
        """The events that open a response: ``response.created``, its output item and its audio content part."""
        where = dict(response_id=response_id, item_id=item_id, output_index=0, content_index=0)
        return [
            self._event("response.created", response=self._response(response_id, "in_progress", config, [], metadata)),
            self._event(
                "response.output_item.added",
                response_id=response_id,
                output_index=0,
                item=self.item(item_id, "in_progress", None),
            ),
            self._event("response.content_part.added", **where, part={"type": "audio", "transcript": ""}),
        ]

    def audio_delta(self, response_id: str, item_id: str, audio: bytes) -> str:
        """``response.output_audio.delta`` (beta: ``response.audio.delta``) with ``audio`` as base64."""
        return self._event(
            "response.output_audio.delta",
            response_id=response_id,
            item_id=item_id,
            output_index=0,
            content_index=0,
            delta=base64.b64encode(audio).decode("ascii"),
        )

    def transcript_delta(self, response_id: str, item_id: str, text: str) -> str:
        """``response.output_audio_transcript.delta`` (beta: ``response.audio_transcript.delta``): a piece of the
        agent's text.
        """
        return self._event(
            "response.output_audio_transcript.delta",
            response_id=response_id,
            item_id=item_id,
            output_index=0,
            content_index=0,
            delta=text,
        )

    def response_finished(
        self,
        response_id: str,
        item_id: str,
        config: SessionConfig,
        transcript: str,
        status: str = "completed",
        metadata: dict[str, str] | None = None,
    ) -> list[str]:
        """The events that close a response, innermost first, ending with ``response.done`` of ``status``."""
        where = dict(response_id=response_id, item_id=item_id, output_index=0, content_index=0)
        item = self.item(item_id, "completed" if status == "completed" else "incomplete", transcript)
        return [
            self._event("response.output_audio.done", **where),
            self._event("response.output_audio_transcript.done", **where, transcript=transcript),
            self._event("response.content_part.done", **where, part={"type": "audio", "transcript": transcript}),
            self._event("response.output_item.done", response_id=response_id, output_index=0, item=item),
            self._event("response.done", response=self._response(response_id, status, config, [item], metadata)),
        ]

    # -- ours (the protocol has no queue)

    def queued(self, position: int) -> str:
        """``pplex.queued``: this server's own event while the session waits for a slot, ``position`` in line."""
        return self._event("pplex.queued", position=position)


def _ga_format(audio_format: AudioFormat) -> dict[str, Any]:
    if audio_format is AudioFormat.PCM16:
        return {"type": audio_format.ga, "rate": audio_format.rate}
    return {"type": audio_format.ga}
