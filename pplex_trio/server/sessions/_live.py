"""The OpenAI Live protocol (``/v1/live/sessions``) on the session core: JSON events, base64 audio, no turns.

The client opens with ``session.start`` (anything else first is answered with an
``error``, and the connection waits on); the conversation is queued and its
prompt run, an ``info`` event telling the caller's place in the queue, and
``session.started`` goes out once it is live.  What the caller appends from
``session.start`` on is heard, in order.  From then on:

* appended audio (PCM16 at 24 or 16 kHz, or G.711 at 8 kHz) feeds the model;
  while muted the model hears silence of the same length, so the call keeps
  its pace;
* every 80 ms frame of the model's voice goes out as an audio delta, silence
  included, and its text as a transcript delta stamped with that frame's place
  on the session timeline (which starts at the model's first step); with
  ``--transcribe``, the caller's words as ``session.input_transcript.delta``
  (the session core's :class:`~._transcript.CallerTranscript`), stamped where
  the caller said them and sent with the frame of the tick that wrote them; usage
  goes out every :data:`USAGE_MS` of it;
* ``session.close`` flushes the model's last words, then ``session.closed``
  and a 1000 close; any other end says why with its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._conversation import FRAME_MS, Conversation, Outcome
from ...engine import OutputFrame
from ...protocol import AudioAppend, ClientEvent, EventError, LiveEvents, live
from ._audio_io import MEDIA_AUDIO, TRACK_ONLY, AudioIn, AudioOut
from ._openai import OpenAIProtocol
from ._transcript import HeardPiece
from ._wire import IGNORED_ON_RESUME, EndOfInput, InputAudio, InputEvent, Message, Replies, ResumeCall, WireProtocol

USAGE_MS = 5_000  # of the session timeline between session.usage.updated events

# Why a session ended (the session core's outcome) → session.closed's reason.
CLOSE_REASONS = {
    Outcome.COMPLETED: "close_requested",
    Outcome.TIME_LIMIT: "expired",
    Outcome.CLIENT_TIMEOUT: "connection_lost",
}  # else: the server hung up (remote_hangup)
CALM_OUTCOMES = frozenset({Outcome.TIME_LIMIT, Outcome.SHUTDOWN, Outcome.DRAINING})  # said as an info, not an error


class LiveProtocol(OpenAIProtocol[LiveEvents]):
    """One connection's OpenAI Live protocol: opened by ``session.start``, then audio both ways (see above)."""

    name = "live"
    early_audio = True
    opening_hint = "send session.start to start the session"

    def __init__(
        self,
        *,
        model: str,
        session_id: str,
        expires_at: int,
        voices: Callable[[], Sequence[str]],
        max_prompt_chars: int,
        align: bool,
    ):
        super().__init__(LiveEvents(session_id=session_id, expires_at=expires_at))
        self.config = live.LiveConfig(model=model)
        self.align_input = align
        self._voices = voices
        self._max_prompt_chars = max_prompt_chars
        self._start_event: str | None = None  # the client's session.start, answered by session.started
        self._close_event: str | None = None  # and its session.close, by session.closed
        self._not_applied: list[EventError] = []  # parts of session.start told once the session has started
        self._audio_in: AudioIn | None = None
        self._audio_out: AudioOut | None = None
        self._muted = False
        self._first_tick: int | None = None  # the session timeline's origin
        self._frames = 0  # the timeline's length in frames, to the end of the last frame sent
        self._opening_audio: InputAudio | None = None
        self._resume: str | None = None  # the token of the paused call this connection resumes (``?resume=``)
        self._resumed: ResumeCall | None = None  # and, once it has, how

    # -- the opening ---------------------------------------------------------------

    def resume_in_url(self, query: bytes) -> None:
        self._resume = self._resume_asked(query)  # (the client speaks first: its session.start completes a resume)
        return None

    def opening(self, query: bytes, message: bytes | str) -> Conversation | ResumeCall | Replies:
        try:
            event = live.parse_client_event(message)
            if not isinstance(event, live.SessionStart):
                raise EventError(
                    f"send session.start first: {event.type} needs a started session",
                    param="type",
                    code="session_not_started",
                    event_id=event.event_id,
                )
            if self._resume is not None:
                self._start_event = event.event_id
                return ResumeCall(self._resume, settings_given=bool(set(event.session) - {"model"}))
            self.config, self._not_applied = live.start_config(
                event.session,
                default_model=self.config.model,
                max_prompt_chars=self._max_prompt_chars,
                voices=self._voices(),
                event_id=event.event_id,
            )
        except EventError as exc:
            return Replies([self._refuse(exc)])
        self._start_event = event.event_id
        self._audio_in = AudioIn(self.config.audio_format)
        self._audio_out = AudioOut(self.config.audio_format)
        return self.config.conversation()

    def resumes_from(self, previous: WireProtocol) -> None:
        assert isinstance(previous, LiveProtocol)
        self.config, self._muted = previous.config, previous._muted
        self.events.session_id, self.events.expires_at = previous.events.session_id, previous.events.expires_at
        self._first_tick, self._frames = previous._first_tick, previous._frames  # (its timeline goes on)
        self._audio_in = AudioIn(self.config.audio_format)
        self._audio_out = AudioOut(self.config.audio_format)

    def offer_resume(self, token: str, *, resumed: ResumeCall | None = None) -> None:
        self.events.resume_token, self._resumed = token, resumed

    # -- client events ---------------------------------------------------------------

    def parse(self, message: Message) -> InputEvent:
        try:
            event = live.parse_client_event(message)
        except EventError as exc:
            return Replies([self._refuse(exc)])
        if isinstance(event, AudioAppend):
            return InputAudio((event.audio, self._muted)) if event.audio else None
        if isinstance(event, live.SessionStart):
            return Replies(
                [
                    self._refuse(
                        EventError(
                            "the session has started already; open a new connection for another",
                            param="type",
                            code="session_already_started",
                            event_id=event.event_id,
                        )
                    )
                ]
            )
        return self._control(event)

    def _control(self, event: ClientEvent) -> InputEvent:
        if event.type == "session.close":
            self._close_event = event.event_id
            return EndOfInput()  # the model's last words go out, then session.closed
        self._muted = event.type == "session.input_audio.mute"
        return Replies([self.events.muted(self._muted, event.event_id)])

    # -- audio in ---------------------------------------------------------------------

    def decode(self, payloads: list[Any]) -> list[np.ndarray]:
        assert self._audio_in is not None
        out = []
        for data, muted in payloads:
            pcm = self._heard(self._audio_in, data)
            out.append(np.zeros_like(pcm) if muted else pcm)  # muted: silence as long as what was said
        return out

    # -- output -----------------------------------------------------------------------

    def keepalive(self, position: int | None) -> Message | None:
        if not position:
            return None
        return self.events.info(
            "queued",
            f"waiting for a conversation slot: number {position} in the queue; what "
            "you send meanwhile is heard once the session starts",
        )

    def ready(self) -> list[Message]:
        started = self.events.started(self.config, self._start_event)
        if self._resumed is not None and self._resumed.settings_given:
            self.notices.note("a resume's session.start named settings: ignored", key="resume_settings")
            started_with: list[Message] = [self.events.info("resume_settings_ignored", IGNORED_ON_RESUME)]
        else:
            started_with = [self._refuse(exc) for exc in self._not_applied]
        return [started, *started_with]

    async def encode(self, frames: list[OutputFrame]) -> list[tuple[Message, OutputFrame | None]]:
        assert self._audio_out is not None
        messages: list[tuple[Message, OutputFrame | None]] = [*self._pending.take()]
        for frame in frames:
            if self._first_tick is None:
                self._first_tick = frame.tick
            index = frame.tick - self._first_tick  # (frames left out for a slow reader leave a gap)
            for heard in self.caller.take(frame.tick) if self.caller is not None else ():
                if isinstance(heard, HeardPiece):  # (Live has no turns: its transcripts are fragments only)
                    start = round(heard.at * 1000)
                    messages.append((self.events.input_transcript_delta(heard.text, start, start + FRAME_MS), None))
            messages.append((self._voice(frame), frame))
            if frame.text:
                messages.append(
                    (self.events.transcript_delta(frame.text, index * FRAME_MS, (index + 1) * FRAME_MS), None)
                )
            if (index + 1) * FRAME_MS // USAGE_MS > self._frames * FRAME_MS // USAGE_MS:
                messages.append((self.events.usage(self._seconds(index + 1)), None))
            self._frames = index + 1
        return messages

    def _voice(self, frame: OutputFrame) -> Message:
        """The message that carries ``frame``'s audio: an audio delta."""
        assert self._audio_out is not None
        return self.events.audio_delta(self._audio_out(frame.pcm))

    def _seconds(self, frames: int) -> float:
        return frames * FRAME_MS / 1000

    def closing(self, message: str | None, code: int, outcome: Outcome) -> list[Message]:
        said: list[Message] = []
        if message is not None:
            said.append(
                self.events.info(outcome.value, message) if outcome in CALM_OUTCOMES else self.error(message, code)
            )
        reason = CLOSE_REASONS.get(outcome, "remote_hangup")
        return [*said, self.events.closed(reason, self.config, self._seconds(self._frames), self._close_event)]


class LiveOverWebRtc(LiveProtocol):
    """The Live protocol of a WebRTC call (``POST /v1/live/sessions`` with an SDP offer): the session's settings
    come with the offer (``session``, checked before the call is answered: ``EventError``), its events on the
    ``oai-events`` data channel, its audio on the tracks (``MEDIA_AUDIO``). The caller's first audio starts it;
    ``session.started`` then tells the client it may send commands (until then they are refused, as OpenAI's
    ``LiveCreateResponse`` says to wait for it); audio appended on the channel is refused."""

    name = "live_webrtc"
    opening_hint = "speak (the microphone track) to start the session"

    def __init__(self, *, session: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config, self._not_applied = live.start_config(
            session,
            default_model=self.config.model,
            max_prompt_chars=self._max_prompt_chars,
            voices=self._voices(),
            event_id=None,
        )

    def resume_in_url(self, query: bytes) -> None:
        return None  # (a WebRTC call survives a network change by an ICE restart, not a resume)

    def opening(self, query: bytes, message: bytes | str) -> Conversation | ResumeCall | Replies:
        if isinstance(message, str):
            early = EventError("wait for session.started before sending commands", code="session_not_started")
            return Replies([self._refuse(early)])
        self._audio_in, self._audio_out = AudioIn(MEDIA_AUDIO), AudioOut(MEDIA_AUDIO)
        self._opening_audio = InputAudio((message, False))
        return self.config.conversation()

    def opening_audio(self) -> InputAudio | None:
        audio, self._opening_audio = self._opening_audio, None
        return audio

    def parse(self, message: Message) -> InputEvent:
        if isinstance(message, bytes):
            return InputAudio((message, self._muted))
        event = super().parse(message)
        return Replies([self._refuse(TRACK_ONLY)]) if isinstance(event, InputAudio) else event

    def _voice(self, frame: OutputFrame) -> Message:
        assert self._audio_out is not None
        return self._audio_out(frame.pcm)  # (bytes: played on the track)
