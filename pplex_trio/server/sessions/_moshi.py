"""The Moshi protocol (``/api/chat``): Ogg Opus in and out, settings in the query.

Byte-compatible with the official PersonaPlex/Moshi web client: the handshake
``0x00`` goes out only once the slot's system prompt has run; ``0x06`` pings
keep a browser page's 10 s inactivity timer alive while it waits (its script
sees no WebSocket pings); a program (no ``Origin`` header) gets none, since
NVIDIA's server sends none and clients such as LiveKit's PersonaPlex plugin
warn at every unknown message: the transport's WebSocket pings keep its
connection alive instead.  Audio is Ogg Opus at
24 kHz, decoded by sphn here and encoded by the server's encoders (a child
process or the event loop, ``_encoders.py``).  See ``docs/PROTOCOL.md``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np
import sphn

from ..._conversation import SAMPLE_RATE, CloseCode, Conversation
from ...engine import OutputFrame
from ...protocol import ProtocolError, conversation_from_params, moshi, parse_query
from .._encoders import Encoders
from ._wire import InputAudio, InputEvent, Message, OpensWithQuery


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

    def conversation(self, query: bytes) -> Conversation:
        return conversation_from_params(
            parse_query(query),
            max_prompt_chars=self._max_prompt_chars,
            voices=None if self._voices is None else self._voices(),
        )

    def parse(self, message: Message) -> InputEvent:
        event = moshi.parse_client_message(message)
        if isinstance(event, moshi.AudioReceived) and event.ogg:
            return InputAudio(event.ogg)
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

    def ready(self) -> list[Message]:
        return [moshi.handshake()]

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
            if frame.text:
                messages.append((moshi.text(frame.text), None))
        return messages

    def error(self, message: str, code: int) -> Message:
        return moshi.error(message)
