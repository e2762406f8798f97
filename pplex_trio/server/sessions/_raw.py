"""The raw PCM protocol (``/v1/audio/duplex``): float32 in and out, JSON control.

For tools and tests that want exact samples, not Opus.  The client opens with
``{"type": "open", ...}``; ``{"type": "close"}`` flushes pending input through
the engine, answers ``{"type": "done"}`` and closes.  Text pieces name their
``speaker``: the agent's, and with ``--transcribe`` the caller's words (the session
core's :class:`~._transcript.CallerTranscript`), sent with the frame of the tick that
wrote them.  See ``docs/PROTOCOL.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..._conversation import CloseCode, Conversation
from ...engine import OutputFrame
from ...protocol import ProtocolError, conversation_from_params, raw
from ._transcript import HeardPiece
from ._wire import IGNORED_ON_RESUME, EndOfInput, InputAudio, InputEvent, Message, OpensWithMessage, ResumeCall


class RawProtocol(OpensWithMessage):
    """One connection's raw PCM protocol: opened by ``{"type": "open", ...}``, float32 both ways."""

    name = "raw"
    early_audio = True
    resumable = True
    opening_hint = 'send {"type": "open", ...} first'

    def __init__(self, *, max_prompt_chars: int, voices: Callable[[], Collection[str]] | None = None):
        self._max_prompt_chars = max_prompt_chars
        self._voices = voices  # the voices a conversation may name (None: not checked here)
        self._closing = False
        self._token: str | None = None
        self._resumed: ResumeCall | None = None

    def opening(self, query: bytes, message: bytes | str) -> Conversation | ResumeCall:
        event = raw.parse_client_message(message)
        if not isinstance(event, raw.Open):
            raise ProtocolError('the first message must be {"type": "open", ...}', CloseCode.POLICY)
        if "resume" in event.params:
            token = event.params["resume"]
            if not isinstance(token, str) or not token:
                raise ProtocolError('"resume" must be the token a "ready" gave', CloseCode.POLICY)
            return ResumeCall(token, settings_given=len(event.params) > 1)
        return conversation_from_params(
            event.params,
            max_prompt_chars=self._max_prompt_chars,
            voices=None if self._voices is None else self._voices(),
        )

    def parse(self, message: Message) -> InputEvent:
        event = raw.parse_client_message(message)
        if isinstance(event, raw.PcmReceived):
            if self._closing:
                raise ProtocolError('audio after "close": nothing may follow a close', CloseCode.POLICY)
            return InputAudio(event.pcm) if event.pcm.size else None
        if isinstance(event, raw.Close):
            if self._closing:
                return None
            self._closing = True
            return EndOfInput()
        raise ProtocolError("the conversation is already open", CloseCode.POLICY)

    def keepalive(self, position: int | None) -> Message | None:
        return raw.queued(position) if position else None

    def offer_resume(self, token: str, *, resumed: ResumeCall | None = None) -> None:
        self._token, self._resumed = token, resumed

    def ready(self) -> list[Message]:
        resumed = self._resumed
        notice = IGNORED_ON_RESUME if resumed is not None and resumed.settings_given else None
        return [raw.ready(self._token, resumed=resumed is not None, notice=notice)]

    async def encode(self, frames: list[OutputFrame]) -> list[tuple[Message, OutputFrame | None]]:
        messages: list[tuple[Message, OutputFrame | None]] = []
        for frame in frames:
            messages.append((raw.pcm_frame(frame.pcm), frame))
            for heard in self.caller.take(frame.tick) if self.caller is not None else ():
                if isinstance(heard, HeardPiece):  # (the raw protocol has no turns: its text is pieces only)
                    messages.append((raw.text(heard.text, raw.USER), None))
            if frame.text:
                messages.append((raw.text(frame.text), None))
        return messages

    def end_of_output(self) -> Message:
        return raw.done()

    def error(self, message: str, code: int) -> Message:
        return raw.error(message)
