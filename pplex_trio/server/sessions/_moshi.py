"""The Moshi protocol (``/api/chat``): Ogg Opus in and out, settings in the query.

Byte-compatible with the official PersonaPlex/Moshi web client: the handshake
``0x00`` goes out only once the slot's system prompt has run; ``0x06`` pings
keep a browser page's 10 s inactivity timer alive while it waits (its script
sees no WebSocket pings); a program (no ``Origin`` header) gets none, since
NVIDIA's server sends none and clients such as LiveKit's PersonaPlex plugin
warn at every unknown message: the transport's WebSocket pings keep its
connection alive instead.  Audio is Ogg Opus at
24 kHz, decoded by sphn here and encoded by the server's encoders (a child
process or the event loop, ``_encoders.py``).  A client that asks with
``?transcribe_caller=1`` (a server with ``--transcribe``) also gets the caller's
words, kind ``0x10``, pplex-trio's own: the official clients never see it.
A client that asks with ``?resumable=1`` gets a resume token (``0x11``, right
after ``0x00``): a dropped connection then pauses its call, which
``?resume=TOKEN`` takes up again, and it hangs up for good with ``0x12``.
Without it a disconnect ends the call, as the official client expects.
See ``docs/PROTOCOL.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np
import sphn

from ..._conversation import SAMPLE_RATE, CloseCode, Conversation
from ...engine import OutputFrame
from ...protocol import SETTING_NAMES, ProtocolError, conversation_from_params, moshi, parse_query
from .._encoders import Encoders
from ._transcript import NO_TRANSCRIBER, HeardPiece
from ._wire import IGNORED_ON_RESUME, Hangup, InputAudio, InputEvent, Message, OpensWithQuery, ResumeCall

TRANSCRIBE_CALLER = "transcribe_caller"  # the query parameter that asks for the caller's words (0x10)
RESUMABLE = "resumable"  # the query parameter that asks for a resume token (0x11)
RESUME = "resume"  # the query parameter that resumes a paused call with its token


class MoshiProtocol(OpensWithQuery):
    """One connection's Moshi protocol: settings from the query, Ogg Opus both ways, ``0x00`` when ready."""

    name = "moshi"

    def __init__(
        self,
        encoders: Encoders,
        *,
        max_prompt_chars: int,
        align: bool,
        voices: Callable[[], Collection[str]] | None = None,
        pings: bool = True,
    ):
        self._encoders = encoders
        self._pings = pings  # 0x06 while waiting: for a browser page
        self._max_prompt_chars = max_prompt_chars
        self._voices = voices  # the voices a conversation may name (None: not checked here)
        self.align_input = align
        self._reader = sphn.OpusStreamReader(SAMPLE_RATE)  # ~0.07 ms of CPU a page
        self._stream: Any = None  # this conversation's encoder stream, while the send task runs
        self._send_caller = False  # the client asked for the caller's words (0x10)
        self._token: str | None = None  # the resume token for the 0x11 that follows the handshake
        self._resumed: ResumeCall | None = None

    def conversation(self, query: bytes) -> Conversation | ResumeCall:
        params = parse_query(query)
        asked = bool(_flag(params, TRANSCRIBE_CALLER))
        if asked and not (self.caller is not None and self.caller.enabled):
            raise ProtocolError(f"{NO_TRANSCRIBER}, or leave out {TRANSCRIBE_CALLER}", CloseCode.POLICY)
        self._send_caller = asked
        resumable = _flag(params, RESUMABLE, None)
        if RESUME in params:
            token = params.pop(RESUME)
            if not token:
                raise ProtocolError(f"{RESUME} must be the token a 0x11 message gave", CloseCode.POLICY)
            if resumable is False:
                raise ProtocolError(f"a resumed call stays resumable: leave out {RESUMABLE}=0", CloseCode.POLICY)
            self.resumable = True  # (a new token follows its handshake)
            return ResumeCall(token, settings_given=not SETTING_NAMES.isdisjoint(params))
        self.resumable = bool(resumable)
        return conversation_from_params(
            params,
            max_prompt_chars=self._max_prompt_chars,
            voices=None if self._voices is None else self._voices(),
        )

    def parse(self, message: Message) -> InputEvent:
        event = moshi.parse_client_message(message)
        if isinstance(event, moshi.AudioReceived) and event.ogg:
            return InputAudio(event.ogg)
        if isinstance(event, moshi.HangupReceived):
            return Hangup()  # (from any client: the call ends at once, not paused)
        return None

    def decode(self, payloads: list[Any]) -> list[np.ndarray]:
        try:
            return [self._reader.append_bytes(ogg) for ogg in payloads]
        except ValueError as exc:
            raise ProtocolError(
                f"audio is not a valid Ogg Opus stream ({exc}); send Ogg pages of 24 kHz mono Opus",
                CloseCode.INVALID_PAYLOAD,
            ) from None

    def keepalive(self, position: int | None) -> Message | None:
        # Queued or preparing alike: the official client has no queue message.
        return moshi.ping() if self._pings else None

    def offer_resume(self, token: str, *, resumed: ResumeCall | None = None) -> None:
        self._token, self._resumed = token, resumed

    def ready(self) -> list[Message]:
        if self._token is None:  # (not asked for, or the server's resuming is off)
            return [moshi.handshake()]
        resumed = self._resumed
        notice = IGNORED_ON_RESUME if resumed is not None and resumed.settings_given else None
        return [moshi.handshake(), moshi.resume(self._token, resumed=resumed is not None, notice=notice)]

    @contextlib.contextmanager
    def output_stream(self) -> Iterator[None]:
        self._stream = self._encoders.open_stream()
        try:
            yield
        finally:
            self._encoders.close_stream(self._stream)

    async def encode(self, frames: list[OutputFrame]) -> list[tuple[Message, OutputFrame | None]]:
        oggs = await self._encoders.encode_many(self._stream, [frame.pcm for frame in frames])
        messages: list[tuple[Message, OutputFrame | None]] = []
        for frame, ogg in zip(frames, oggs):
            if ogg:
                messages.append((moshi.audio(ogg), frame))
            for heard in self.caller.take(frame.tick) if self._send_caller and self.caller is not None else ():
                if isinstance(heard, HeardPiece):  # (no turns here: pieces only, a leading space begins a word)
                    messages.append((moshi.caller_text(heard.text), None))
            if frame.text:
                messages.append((moshi.text(frame.text), None))
        return messages

    def error(self, message: str, code: int) -> Message:
        return moshi.error(message)


def _flag(params: dict[str, str], name: str, default: bool | None = False) -> bool | None:
    """The query's ``0`` or ``1`` for ``name`` (taken out of ``params``), or ``default`` when it is absent."""
    value = params.pop(name, None)
    if value is None:
        return default
    if value not in ("0", "1"):
        raise ProtocolError(f"{name} must be 0 or 1, got {value!r}", CloseCode.POLICY)
    return value == "1"
