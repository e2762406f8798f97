"""The OpenAI Realtime protocol's events, both dialects, sans-IO: JSON text in, events out.

Two dialects share one route (``/v1/realtime``): the GA protocol (the
``openai`` SDK's ``client.realtime.connect()``) and the beta one
(``client.beta.realtime.connect()``, header ``OpenAI-Beta: realtime=v1``).
They differ in a few event names (``response.output_audio.delta`` is beta's
``response.audio.delta``) and in the shape of the session object; a
:class:`ServerEvents` of either dialect writes the same facts in its shape.

What of the protocol a full-duplex model can honour is in ``docs/PROTOCOL.md``;
this module reads client events and checks the values of a session update
(:func:`apply_session_update`); ``_realtime_events.py`` writes the server's.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._conversation import Conversation, Sampling
from ._audio import Encoding, SampleFormat
from ._errors import EventError, ProtocolError
from ._openai_events import ClientEvent, audio_append, load_event
from ._params import persona_text, temperature, voice_choice


class Dialect(enum.Enum):
    """Which shape of the protocol a connection speaks: GA, or beta (header ``OpenAI-Beta: realtime=v1``)."""

    GA = "ga"
    BETA = "beta"


class AudioFormat(enum.Enum):
    """The audio formats of the protocol, by what they are; ``rate`` in Hz."""

    PCM16 = ("audio/pcm", "pcm16", 24_000)
    PCMU = ("audio/pcmu", "g711_ulaw", 8_000)
    PCMA = ("audio/pcma", "g711_alaw", 8_000)

    def __init__(self, ga: str, beta: str, rate: int):
        self.ga = ga
        self.beta = beta
        self.rate = rate

    @property
    def sample_format(self) -> SampleFormat:
        """The format as the session adapter's codec takes it (encoding and rate)."""
        return SampleFormat(Encoding(self.ga), self.rate)

    @classmethod
    def named(cls, name: str) -> AudioFormat | None:
        """The format a client names in either dialect (``audio/pcm`` or ``pcm16``, ...); None for an unknown name."""
        return next((f for f in cls if name in (f.ga, f.beta)), None)


# -- the session -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SessionConfig:
    """What a session can set that this server honours."""

    instructions: str = ""
    voice: str | None = None  # a name from /api/voices; None: the engine's default
    input_format: AudioFormat = AudioFormat.PCM16
    output_format: AudioFormat = AudioFormat.PCM16
    temperature: float = Sampling().audio_temperature  # beta's `temperature`: the audio sampling temperature
    # The caller's words asked for (beta's `input_audio_transcription`, GA's `audio.input.transcription`): the
    # client's object as echoed back (its string fields), None when off.
    transcription: dict[str, str] | None = None

    def conversation(self) -> Conversation:
        """The conversation these settings ask of the engine: persona, voice, and the audio temperature."""
        return Conversation(
            persona=self.instructions,
            voice=self.voice,
            sampling=dataclasses.replace(Sampling(), audio_temperature=self.temperature),
        )


def _object(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``parent[key]`` when it is an object, else an empty one."""
    value = parent.get(key)
    return value if isinstance(value, Mapping) else {}


def apply_session_update(
    config: SessionConfig,
    session: Any,
    *,
    started: bool,
    max_prompt_chars: int,
    voices: Callable[[], Sequence[str]],
    event_id: str | None = None,
) -> tuple[SessionConfig, EventError | None]:
    """``config`` with a ``session.update``'s ``session`` applied; both dialects' field names are read.

    Unknown fields are ignored. OpenAI's voice names stand for the voices of :data:`OPENAI_VOICES`.
    Raises :class:`EventError` (with ``param``) for a bad value, and for a change of audio
    format once the conversation has ``started``; an unknown voice alone is not applied, the rest
    is, and its error is returned beside the new config.
    """
    if not isinstance(session, Mapping):
        raise EventError("session must be an object", param="session", event_id=event_id)
    changes: dict[str, Any] = {}
    audio = _object(session, "audio")
    audio_in = _object(audio, "input")
    audio_out = _object(audio, "output")

    voice_param, voice = (
        ("session.audio.output.voice", audio_out["voice"])
        if "voice" in audio_out
        else ("session.voice", session["voice"])
        if "voice" in session
        else (None, None)
    )
    voice_error = None
    if voice_param is not None:
        try:
            changes["voice"] = voice_choice(voice, param=voice_param, voices=voices())
        except ProtocolError as exc:
            voice_error = EventError(exc.message, param=exc.param, code=exc.kind, event_id=event_id)
    try:
        if "instructions" in session:
            changes["instructions"] = persona_text(
                session["instructions"], param="session.instructions", max_chars=max_prompt_chars
            )
        if "temperature" in session:
            changes["temperature"] = temperature(session["temperature"], param="session.temperature")
    except ProtocolError as exc:
        raise EventError(exc.message, param=exc.param, code=exc.kind, event_id=event_id) from None
    if "transcription" in audio_in or "input_audio_transcription" in session:
        param, value = (
            ("session.audio.input.transcription", audio_in["transcription"])
            if "transcription" in audio_in
            else ("session.input_audio_transcription", session["input_audio_transcription"])
        )
        changes["transcription"] = _transcription(value, param, event_id)
    for side, ga_block, beta_name in (
        ("input", audio_in, "input_audio_format"),
        ("output", audio_out, "output_audio_format"),
    ):
        if "format" in ga_block:
            param, value = f"session.audio.{side}.format", ga_block["format"]
        elif beta_name in session:
            param, value = f"session.{beta_name}", session[beta_name]
        else:
            continue
        changes[f"{side}_format"] = _audio_format(value, param, event_id)
    if started:  # (a new persona, voice or temperature runs the prompt again: the session's to do)
        for side in ("input_format", "output_format"):
            if side in changes and changes[side] != getattr(config, side):
                raise EventError(
                    f"the {side.replace('_', ' ')} cannot change once audio flows; open a new session",
                    param=f"session.{side}",
                    code="session_started",
                    event_id=event_id,
                )
    return dataclasses.replace(config, **changes), voice_error


def _transcription(value: Any, param: str, event_id: str | None) -> dict[str, str] | None:
    """The transcription a client asks for: None (off), or its object's string fields (model, language, prompt)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise EventError(f"{param} must be an object or null", param=param, event_id=event_id)
    return {k: v for k, v in value.items() if k in ("model", "language", "prompt") and isinstance(v, str)}


def _audio_format(value: Any, param: str, event_id: str | None) -> AudioFormat:
    name, rate = (value.get("type"), value.get("rate")) if isinstance(value, Mapping) else (value, None)
    found = AudioFormat.named(name) if isinstance(name, str) else None
    if found is None or rate not in (None, found.rate):
        supported = ", ".join(f"{f.ga} / {f.beta} ({f.rate} Hz)" for f in AudioFormat)
        raise EventError(
            f"unsupported audio format {json.dumps(value)[:80]}: this server speaks {supported}",
            param=param,
            event_id=event_id,
        )
    return found


# -- client events -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SessionUpdate(ClientEvent):
    """``session.update``: the session object as sent, checked later by :func:`apply_session_update`."""

    session: Any


@dataclasses.dataclass(frozen=True)
class ResponseCreate(ClientEvent):
    """``response.create``: starts the conversation if it has not started; ``metadata`` is echoed in the response it
    opens.
    """

    metadata: dict[str, str] | None  # echoed in the response it opens (frameworks match replies by it)


@dataclasses.dataclass(frozen=True)
class ItemEvent(ClientEvent):
    """``conversation.item.*``: read by :class:`~._realtime_items.ConversationItems`."""

    fields: Mapping[str, Any]


# Events answered without effect on a full-duplex model, and events refused (docs/PROTOCOL.md).
ANSWERED = frozenset(
    {"input_audio_buffer.commit", "input_audio_buffer.clear", "response.cancel", "output_audio_buffer.clear"}
)
ITEM_EVENTS = frozenset(
    {"conversation.item.create", "conversation.item.truncate", "conversation.item.delete", "conversation.item.retrieve"}
)
REFUSED: frozenset[str] = frozenset()
HANGUP = "session.close"  # pplex-trio's own (Live's name; OpenAI's Realtime has none): the client ends the call
MAX_METADATA = 16  # OpenAI's limits on a response's metadata: 16 pairs of strings
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512


def parse_client_event(message: bytes | str) -> ClientEvent:
    """One client message → an event; :class:`EventError` for what is not a valid event (see :func:`load_event`)."""
    event, head = load_event(message, "Realtime")
    kind, event_id = head.type, head.event_id
    if kind in ("session.update", "transcription_session.update"):  # (the latter: the caller's words alone)
        return SessionUpdate(kind, event_id, event.get("session"))
    if kind == "input_audio_buffer.append":
        return audio_append(event, head)
    if kind == "response.create":
        return ResponseCreate(kind, event_id, _metadata(_object(event, "response").get("metadata"), event_id))
    if kind in ITEM_EVENTS:
        return ItemEvent(kind, event_id, event)
    if kind in ANSWERED or kind == HANGUP:
        return ClientEvent(kind, event_id)
    if kind in REFUSED:
        raise EventError(
            f"{kind} is not supported: this server transcribes nothing; PersonaPlex is a "
            "full-duplex speech model (see docs/PROTOCOL.md)",
            param="type",
            code="unsupported_event",
            event_id=event_id,
        )
    raise EventError(f"unknown event type {kind[:80]!r}", param="type", code="invalid_event_type", event_id=event_id)


def _metadata(value: Any, event_id: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    if (
        not isinstance(value, Mapping)
        or len(value) > MAX_METADATA
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_METADATA_KEY and len(v) <= MAX_METADATA_VALUE
            for k, v in value.items()
        )
    ):
        raise EventError(
            f"response.metadata must be an object of at most {MAX_METADATA} string pairs (keys up "
            f"to {MAX_METADATA_KEY} characters, values up to {MAX_METADATA_VALUE})",
            param="response.metadata",
            event_id=event_id,
        )
    return dict(value)
