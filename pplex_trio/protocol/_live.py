"""The OpenAI Live protocol (``gpt-live``), sans-IO: its client events in, the session's settings checked.

Live is full duplex and has no turns: a ``session.start`` with the session's
settings, then the caller's audio both ways, mute and unmute, and a
``session.close``.  What PersonaPlex cannot do (delegation to a text model,
text appended to the conversation, startup history, decisions, fixtures) is
refused with an ``error`` event (:class:`EventError`) naming the client's
event; ``docs/PROTOCOL.md`` has the table.  The server's events are
``_live_events.py``'s.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from typing import Any

from .._conversation import Conversation
from ._audio import Encoding, SampleFormat
from ._errors import EventError, ProtocolError
from ._openai_events import ClientEvent, audio_append, load_event
from ._params import persona_text, voice_choice

PCM_RATES = (24_000, 16_000)  # Live's PCM rates; G.711 is 8 kHz
G711_RATE = 8_000
DEFAULT_FORMAT = SampleFormat(Encoding.PCM16, 24_000)  # what Pipecat and LiveKit assume, never asking

# Client events answered with an error: what a full-duplex speech model has no use for, and why.
REFUSED = {
    "session.update": "the session's settings are fixed at session.start on this server; open a new session",
    "session.instructions.append": "PersonaPlex takes its instructions once, as the system prompt it runs before "
    "the conversation; give them in session.start",
    "session.thinking.append": "PersonaPlex has no text context beside the conversation's audio to append to",
    "session.commentary.append": "PersonaPlex speaks from the conversation's audio only; it cannot be handed "
    "text to say",
    "session.output_audio.fixture.play": "fixture audio is not supported",
    "response.create": "delegation to a Responses model is not supported",
    "response.item.create": "delegation to a Responses model is not supported",
    "decision.create": "decisions delegation is not supported",
    "decision.item.create": "decisions delegation is not supported",
    "decision.item.delete": "decisions delegation is not supported",
}
WHY = "PersonaPlex is a full-duplex speech model (see docs/PROTOCOL.md)"


@dataclasses.dataclass(frozen=True)
class LiveConfig:
    """A Live session's settings that this server honours."""

    model: str
    instructions: str = ""
    voice: str | None = None  # a name from /api/voices; None: the engine's default
    audio_format: SampleFormat = DEFAULT_FORMAT

    def conversation(self) -> Conversation:
        """The conversation these settings ask of the engine (persona and voice)."""
        return Conversation(persona=self.instructions, voice=self.voice)


@dataclasses.dataclass(frozen=True)
class SessionStart(ClientEvent):
    """``session.start``: the session's settings as the client sent them, read by the session adapter."""

    session: Mapping[str, Any]


SIMPLE = frozenset({"session.input_audio.mute", "session.input_audio.unmute", "session.close"})


def parse_client_event(message: bytes | str) -> ClientEvent:
    """One client message → an event; :class:`EventError` for one the server does not take (see
    :func:`load_event`)."""
    event, head = load_event(message, "Live")
    kind, event_id = head.type, head.event_id
    if kind == "session.start":
        session = event.get("session")
        if not isinstance(session, Mapping):
            raise EventError("session must be an object", param="session", event_id=event_id)
        return SessionStart(kind, event_id, session)
    if kind == "session.input_audio.append":
        return audio_append(event, head)
    if kind in SIMPLE:
        return head
    if kind in REFUSED:
        raise EventError(
            f"{kind} is not supported: {REFUSED[kind]}; {WHY}",
            param="type",
            code="unsupported_event",
            event_id=event_id,
        )
    raise EventError(f"unknown event type {kind[:80]!r}", param="type", code="invalid_event_type", event_id=event_id)


def start_config(
    session: Mapping[str, Any],
    *,
    default_model: str,
    max_prompt_chars: int,
    voices: Collection[str],
    event_id: str | None,
) -> tuple[LiveConfig, list[EventError]]:
    """A ``session.start``'s settings, checked; beside them, what of it is not applied (to be told once the
    session has started: an ``error`` before ``session.started`` ends a Pipecat session, and leaves LiveKit's
    waiting for ever).

    Raises :class:`EventError` for what the session cannot start with (bad instructions or audio format).
    """
    model = session.get("model")
    config = LiveConfig(model=model[:200] if isinstance(model, str) and model else default_model)
    try:
        if session.get("instructions") is not None:
            config = dataclasses.replace(
                config,
                instructions=persona_text(
                    session["instructions"], param="session.instructions", max_chars=max_prompt_chars
                ),
            )
    except ProtocolError as exc:
        raise EventError(exc.message, param=exc.param, code=exc.kind, event_id=event_id) from None
    audio = session.get("audio")
    audio = audio if isinstance(audio, Mapping) else {}
    if audio.get("format") is not None:
        config = dataclasses.replace(config, audio_format=_audio_format(audio["format"], event_id))
    not_applied = []
    output = audio.get("output")
    if isinstance(output, Mapping) and output.get("voice") is not None:
        try:
            config = dataclasses.replace(
                config, voice=voice_choice(output["voice"], param="session.audio.output.voice", voices=voices)
            )
        except ProtocolError as exc:  # the session starts with the default voice
            not_applied.append(
                EventError(
                    f"{exc.message}; this session speaks with the default voice",
                    param=exc.param,
                    code="unknown_voice",
                    event_id=event_id,
                )
            )
    delegation = session.get("delegation")
    if isinstance(delegation, Mapping) and delegation.get("type") not in (None, "client"):
        not_applied.append(
            EventError(
                f"delegation {str(delegation.get('type'))[:40]!r} (and its tools) is not supported: {WHY}; the session "
                "goes on without it",
                param="session.delegation",
                code="unsupported_delegation",
                event_id=event_id,
            )
        )
    if session.get("input"):
        not_applied.append(
            EventError(
                f"startup input history is not supported: PersonaPlex starts from its instructions only; {WHY}",
                param="session.input",
                code="unsupported_input",
                event_id=event_id,
            )
        )
    if session.get("triggers"):
        not_applied.append(
            EventError(
                f"decision triggers are not supported: {WHY}",
                param="session.triggers",
                code="unsupported_triggers",
                event_id=event_id,
            )
        )
    return config, not_applied


def _audio_format(value: Any, event_id: str | None) -> SampleFormat:
    kind, rate = (value.get("type"), value.get("rate")) if isinstance(value, Mapping) else (None, None)
    try:
        encoding = Encoding(kind)
    except ValueError:
        encoding = None
    if encoding is Encoding.PCM16 and rate in (*PCM_RATES, None):
        return SampleFormat(encoding, rate or PCM_RATES[0])
    if encoding in (Encoding.PCMU, Encoding.PCMA) and rate in (G711_RATE, None):
        return SampleFormat(encoding, G711_RATE)
    raise EventError(
        f"unsupported audio format {json.dumps(value)[:80]}: this server speaks audio/pcm at 24000 or "
        "16000 Hz, and audio/pcmu or audio/pcma at 8000 Hz",
        param="session.audio.format",
        code="unsupported_audio_format",
        event_id=event_id,
    )
