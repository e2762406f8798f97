"""The OpenAI Realtime protocol (``/v1/realtime``) on the session core: JSON events, base64 audio.

The connection opens with ``session.created``; ``session.update`` events are
answered until the first ``input_audio_buffer.append`` or ``response.create``,
which starts the conversation with the session as configured then (the
opening, in the session core's terms).  From then on:

* appended audio (PCM16 at 24 kHz, or G.711 at 8 kHz, resampled) feeds the
  model; a small VAD on it gives ``speech_started`` / ``speech_stopped``;
* every 80 ms frame of the model's voice goes out as an audio delta, silence
  included, its text as transcript deltas;
* with ``input_audio_transcription`` (beta) or ``audio.input.transcription`` (GA)
  on, the caller's words (the session core's :class:`~._transcript.CallerTranscript`)
  as ``conversation.item.input_audio_transcription.delta`` and, at the end of their
  turn, ``.completed``, in the user item of the VAD's ``speech_started``;
* responses tile the conversation: one is open from the moment the
  conversation is live; the caller starting to speak, ``response.create`` and
  ``response.cancel`` end it (completed, or cancelled) and open the next at
  once, so every delta belongs to an open response.

What the protocol has that a full-duplex model cannot do is answered or refused
as ``docs/PROTOCOL.md`` says.  Events the VAD and the cuts produce are queued
here and go out with the next frame, from the send task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._conversation import SAMPLE_RATE, Conversation
from ...codec import EnergyVAD
from ...engine import OutputFrame
from ...protocol import (
    REALTIME_HANGUP,
    AudioAppend,
    ConversationItems,
    Dialect,
    EventError,
    ItemEvent,
    ResponseCreate,
    ServerEvents,
    SessionConfig,
    SessionUpdate,
    apply_session_update,
    parse_realtime_event,
)
from ._audio_io import MEDIA_AUDIO, TRACK_ONLY, AudioIn, AudioOut
from ._openai import OpenAIProtocol
from ._transcript import NO_TRANSCRIBER, HeardPiece
from ._wire import Hangup, InputAudio, InputEvent, Message, Replies, Restart, ResumeCall, WireProtocol

SUBPROTOCOL = "realtime"  # what browsers offer (with the token and beta markers beside it)


def dialect_of(headers: Any, subprotocols: Sequence[str]) -> Dialect:
    """Beta when the client says so (the SDK's ``OpenAI-Beta: realtime=v1``, or a browser's subprotocol)."""
    beta = "realtime=v1" in (headers.get("OpenAI-Beta") or "").replace(" ", "") or any(
        p.startswith("openai-beta.realtime-v1") for p in subprotocols
    )
    return Dialect.BETA if beta else Dialect.GA


class RealtimeProtocol(OpenAIProtocol[ServerEvents]):
    """One connection's OpenAI Realtime protocol in ``dialect``: configured (from ``config``, then by the client)
    until the first append or ``response.create``, then audio both ways in responses that tile the conversation
    (see above)."""

    name = "realtime"
    early_audio = True
    opening_hint = "send input_audio_buffer.append (or response.create) to start the conversation"

    def __init__(
        self,
        dialect: Dialect,
        *,
        model: str,
        voices: Callable[[], Sequence[str]],
        max_prompt_chars: int,
        align: bool,
        subprotocol: str | None = None,
        config: SessionConfig | None = None,
    ):
        super().__init__(ServerEvents(dialect, model=model))
        self.dialect = dialect
        self.config = config or SessionConfig()  # (a client secret's settings: its session.created shows them)
        self.subprotocol = subprotocol
        self.align_input = align
        self._voices = voices
        self._max_prompt_chars = max_prompt_chars
        self._started = False
        self._audio_in: AudioIn | None = None
        self._audio_out: AudioOut | None = None
        self._vad = EnergyVAD(SAMPLE_RATE)
        self._speech_item: str | None = None  # the caller's speech in progress, as an input item
        self._last_item: str | None = None  # the last committed input item
        self._opening_audio: InputAudio | None = None
        self._answer_first = False  # the opening was response.create: the model speaks without waiting
        self._response: str | None = None  # the open response and its one item
        self._item: str | None = None
        self._metadata: dict[str, str] | None = None  # the open response's (or, before it, the next one's)
        self._transcript: list[str] = []
        self._heard_item: str | None = None  # the user item the caller's words go to now
        self._heard_done: str | None = None  # the last user item whose words were completed
        self.items = ConversationItems(self.events.new_id)
        self._resumed = False  # this connection resumed a paused call (``?resume=``)

    # -- the opening -----------------------------------------------------------------

    def resume_in_url(self, query: bytes) -> ResumeCall | None:
        token = self._resume_asked(query)  # (the server speaks first: a resume is the URL's alone)
        return None if token is None else ResumeCall(token, settings_given=False)

    def resumes_from(self, previous: WireProtocol) -> None:
        assert isinstance(previous, RealtimeProtocol)
        self.config, self.items = previous.config, previous.items
        self.events.carry_on(previous.events)
        self._start()

    def offer_resume(self, token: str, *, resumed: ResumeCall | None = None) -> None:
        self.events.resume_token, self._resumed = token, resumed is not None

    def greeting(self) -> list[Message]:
        return [self.events.session_created(self.config)]

    def opening(self, query: bytes, message: bytes | str) -> Conversation | Replies:
        event = self._parse(message)
        if isinstance(event, Replies):
            return event
        if isinstance(event, (AudioAppend, ResponseCreate)):
            self._start()
            if isinstance(event, ResponseCreate):
                self._metadata = event.metadata  # for the first response
                self._answer_first = True
            if isinstance(event, AudioAppend) and event.audio:
                self._opening_audio = InputAudio(event.audio)  # heard too: see WireProtocol.opening_audio
            return self.config.conversation()
        answer = self._answer(event)
        assert isinstance(answer, Replies)  # (nothing to restart before the start)
        return answer

    def opening_audio(self) -> InputAudio | None:
        audio, self._opening_audio = self._opening_audio, None
        return audio

    def begins_at_once(self) -> bool:
        return self._answer_first

    def _start(self) -> None:
        self._started = True
        self._audio_in = AudioIn(self.config.input_format.sample_format)
        self._audio_out = AudioOut(self.config.output_format.sample_format)

    # -- client events ---------------------------------------------------------------

    def _parse(self, message: Message) -> Any:
        """An event, or the ``error`` event that answers a bad one."""
        try:
            return parse_realtime_event(message)
        except EventError as exc:
            return Replies([self._refuse(exc)])

    def parse(self, message: Message) -> InputEvent:
        event = self._parse(message)
        if isinstance(event, Replies):
            return event
        if isinstance(event, AudioAppend):
            return InputAudio(event.audio) if event.audio else None
        if event.type == REALTIME_HANGUP:
            return Hangup()  # (the call ends at once, not paused for a resume)
        return self._answer(event)

    def _answer(self, event: Any) -> Replies | Restart:
        """The events that do not carry audio (before or after the start)."""
        events = self.events
        if isinstance(event, SessionUpdate):
            before = self.config
            try:
                self.config, voice_error = apply_session_update(
                    self.config,
                    event.session,
                    started=self._started,
                    max_prompt_chars=self._max_prompt_chars,
                    voices=self._voices,
                    event_id=event.event_id,
                )
            except EventError as exc:
                return Replies([self._refuse(exc)])
            updated: list[Message] = []
            if self.config.transcription is not None and not (self.caller and self.caller.enabled):
                self.config = dataclasses.replace(self.config, transcription=None)
                param = (
                    "session.audio.input.transcription"
                    if self.dialect is Dialect.GA
                    else "session.input_audio_transcription"
                )
                refusal = EventError(
                    NO_TRANSCRIBER, param=param, code="transcription_unavailable", event_id=event.event_id
                )
                updated.append(self._refuse(refusal))
            if event.type == "transcription_session.update" and self.dialect is Dialect.BETA:
                updated.insert(0, events.transcription_session_updated(self.config))
            else:
                updated.insert(0, events.session_updated(self.config))
            if voice_error is not None:
                updated.append(self._refuse(voice_error))
            if self._started and self.config.conversation() != before.conversation():
                return Restart(self.config.conversation(), updated)  # a new persona: the prompt runs again
            return Replies(updated)
        if isinstance(event, ResponseCreate) or event.type == "response.cancel":
            created = isinstance(event, ResponseCreate)
            if self._response is None:  # not live yet: the first response will carry its metadata
                if created:
                    self._metadata = event.metadata
            else:
                self._pending.add(
                    *self._cut("completed" if created else "cancelled", event.metadata if created else None)
                )
            return Replies([])
        self.notices.note(f"{event.type}: answered, without effect on the model (docs/PROTOCOL.md)", key=event.type)
        if isinstance(event, ItemEvent):
            try:
                return Replies(self._item_event(event))
            except EventError as exc:
                return Replies([self._refuse(exc)])
        if event.type == "input_audio_buffer.commit":
            item = self._speech_item or events.new_id("item")
            previous, self._last_item = self._last_item, item
            self.items.record(
                {
                    "id": item,
                    "object": "realtime.item",
                    "type": "message",
                    "role": "user",
                    "status": "completed",
                    "content": [{"type": "input_audio", "transcript": None}],
                }
            )
            return Replies([events.committed(item, previous)])
        if event.type == "input_audio_buffer.clear":
            return Replies([events.cleared()])
        if event.type == "output_audio_buffer.clear":
            return Replies([events.output_cleared(self._response or events.new_id("resp"))])
        raise AssertionError(event.type)

    def _item_event(self, event: ItemEvent) -> list[Message]:
        items, events = self.items, self.events
        if event.type == "conversation.item.create":
            return [*events.item_added(*items.create(event.fields, event.event_id))]
        if event.type == "conversation.item.truncate":
            return [events.item_truncated(*items.truncate(event.fields, event.event_id))]
        if event.type == "conversation.item.delete":
            return [events.item_deleted(items.delete(event.fields, event.event_id))]
        return [events.item_retrieved(items.retrieve(event.fields, event.event_id))]

    # -- audio in ---------------------------------------------------------------------

    def decode(self, payloads: list[Any]) -> list[np.ndarray]:
        assert self._audio_in is not None
        out = []
        for data in payloads:
            pcm = self._heard(self._audio_in, data)
            for speech in self._vad.feed(pcm):
                if speech.started:
                    self._speech_item = self.events.new_id("item")
                    self._pending.add(self.events.speech_started(speech.at_ms, self._speech_item))
                    if self._response is not None:
                        self._pending.add(
                            *self._cut("completed")
                        )  # the caller's turn starts: so does the next response
                elif self._speech_item is not None:
                    self._pending.add(self.events.speech_stopped(speech.at_ms, self._speech_item))
            out.append(pcm)
        return out

    # -- output -----------------------------------------------------------------------

    def keepalive(self, position: int | None) -> Message | None:
        return self.events.queued(position) if position else None

    def ready(self) -> list[Message]:
        # A resumable call's token: a resumed one's in its session.created (sent now, with the session it goes on
        # with), a new one's in a session.updated.
        if self._resumed:
            said = [self.events.session_created(self.config)]
        elif self.events.resume_token is not None:
            said = [self.events.session_updated(self.config)]
        else:
            said = []
        return [*said, *self._open_response()]

    def _open_response(self) -> list[Message]:
        self._response, self._item = self.events.new_id("resp"), self.events.new_id("item")
        self._transcript = []
        self.items.record(self.events.item(self._item, "in_progress", None))
        return [*self.events.response_started(self._response, self._item, self.config, self._metadata)]

    def _cut(self, status: str, next_metadata: dict[str, str] | None = None) -> list[Message]:
        """End the open response and open the next (with ``next_metadata``), back to back."""
        assert self._response is not None and self._item is not None
        transcript = "".join(self._transcript)
        done = self.events.response_finished(
            self._response, self._item, self.config, transcript, status, self._metadata
        )
        self.items.record(
            self.events.item(self._item, "completed" if status == "completed" else "incomplete", transcript)
        )
        self._metadata = next_metadata
        return done + self._open_response()

    async def encode(self, frames: list[OutputFrame]) -> list[tuple[Message, OutputFrame | None]]:
        assert self._audio_out is not None
        messages: list[tuple[Message, OutputFrame | None]] = [*self._pending.take()]
        for frame in frames:
            assert self._response is not None and self._item is not None
            messages.extend((message, None) for message in self._caller_words(frame.tick))
            messages.append((self._voice(frame), frame))
            if frame.text:
                self._transcript.append(frame.text)
                messages.append((self.events.transcript_delta(self._response, self._item, frame.text), None))
        return messages

    def _voice(self, frame: OutputFrame) -> Message:
        """The message that carries ``frame``'s audio: an audio delta of the open response."""
        assert self._audio_out is not None and self._response is not None and self._item is not None
        return self.events.audio_delta(self._response, self._item, self._audio_out(frame.pcm))

    def _caller_words(self, tick: int) -> list[Message]:
        """The caller's words that came with engine ticks up to ``tick``, when the client asked for them: deltas in
        the user item of the caller's speech (created first if the client has not seen it), then its
        ``.completed`` at the end of their turn."""
        if self.caller is None:
            return []
        events = self.events
        out: list[Message] = []
        for event in self.caller.take(tick):
            if self.config.transcription is None:
                continue
            if isinstance(event, HeardPiece):
                if self._heard_item is None:
                    speech = self._speech_item
                    self._heard_item = speech if speech not in (None, self._heard_done) else events.new_id("item")
                    previous = self.items.last_id
                    item = events.user_item(self._heard_item, None)
                    self.items.record(item)
                    out.extend(events.item_added(previous, item))
                out.append(events.input_transcript_delta(self._heard_item, event.text))
            elif self._heard_item is not None:
                seconds = event.words[-1].end - event.words[0].start
                out.append(events.input_transcript_completed(self._heard_item, event.text, seconds))
                self.items.record(events.user_item(self._heard_item, event.text))
                self._heard_item, self._heard_done = None, self._heard_item
        return out


class RealtimeOverWebRtc(RealtimeProtocol):
    """The Realtime protocol of a WebRTC call (``POST /v1/realtime/calls``): the same events on the ``oai-events``
    data channel, the audio on the tracks (``MEDIA_AUDIO``). The caller's first audio (or ``response.create``)
    starts the conversation, as a first append does on the WebSocket; audio appended on the channel is refused."""

    name = "realtime_webrtc"
    opening_hint = "speak (the microphone track), or send response.create, to start the conversation"

    def opening(self, query: bytes, message: bytes | str) -> Conversation | Replies:
        if isinstance(message, bytes):
            self._start()
            self._opening_audio = InputAudio(message)
            return self.config.conversation()
        if isinstance(self._parse(message), AudioAppend):
            return Replies([self._refuse(TRACK_ONLY)])
        return super().opening(query, message)

    def _start(self) -> None:
        super()._start()
        self._audio_in, self._audio_out = AudioIn(MEDIA_AUDIO), AudioOut(MEDIA_AUDIO)

    def parse(self, message: Message) -> InputEvent:
        if isinstance(message, bytes):
            return InputAudio(message)
        event = super().parse(message)
        return Replies([self._refuse(TRACK_ONLY)]) if isinstance(event, InputAudio) else event

    def _voice(self, frame: OutputFrame) -> Message:
        assert self._audio_out is not None
        return self._audio_out(frame.pcm)  # (bytes: played on the track)
