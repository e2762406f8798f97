"""The Moshi protocol session (``/api/chat``): Ogg Opus in and out.

Byte-compatible with the official PersonaPlex/Moshi web client: the handshake
``0x00`` goes out only once the slot's system prompt has run; audio is Ogg
Opus at 24 kHz through sphn, one reader and one writer per connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sphn
import trio

from .._channel import DropOldestChannel
from ..engine import SAMPLE_RATE, Conversation, Lease, LeaseState, OutputFrame
from ..protocol import CloseCode, ProtocolError, conversation_from_params, moshi, parse_query
from ._session import Outgoing, Session, frame_times


class MoshiSession(Session):
    protocol = "moshi"
    _stream: Any = None  # this conversation's Opus encoder in the server's pool, while the send task runs

    @property
    def align_input(self) -> bool:  # type: ignore[override]
        return self.settings.framing == "aligned"

    async def negotiate(self) -> Conversation:
        params = parse_query(self.ws.query_string)
        return conversation_from_params(params, max_prompt_chars=self.settings.max_prompt_chars)

    async def keepalive(self, lease: Lease) -> None:
        # The official client closes after 10 s without any message.
        await self.ws.send(moshi.ping())

    async def send_ready(self) -> None:
        await self.ws.send(moshi.handshake())

    def error_message(self, message: str) -> bytes:
        return moshi.error(message)

    async def receive_loop(self, inbound: DropOldestChannel[Any]) -> None:
        max_bytes = self.settings.max_message_bytes
        while True:
            message = await self.ws.receive()
            self.stats.messages_received += 1
            arrived = trio.current_time()
            event = moshi.parse_client_message(message, max_bytes=max_bytes)
            if isinstance(event, moshi.AudioReceived):
                if event.ogg:
                    inbound.send_nowait((arrived, event.ogg))
            else:
                self.stats.messages_ignored += 1

    async def decode_loop(self, inbound: DropOldestChannel[Any], lease: Lease) -> None:
        reader = sphn.OpusStreamReader(SAMPLE_RATE)  # ~0.07 ms of CPU a page: cheaper here than anywhere else
        actor = self.server.actor
        frame_size = actor.engine.frame_size
        decoded = 0
        while True:
            try:
                batch = await inbound.receive_batch()
            except trio.EndOfChannel:
                return
            try:
                pcms = [reader.append_bytes(ogg) for _, ogg in batch]
            except ValueError as exc:
                raise ProtocolError(
                    f"audio is not a valid Ogg Opus stream ({exc}); send Ogg pages of 24 kHz mono Opus",
                    CloseCode.INVALID_PAYLOAD,
                ) from None
            for (arrived, _), pcm in zip(batch, pcms):
                if pcm.size and lease.state is LeaseState.LIVE:
                    if self.handshake_sent is not None and arrived >= self.handshake_sent:
                        reaction = self.server.client_reaction
                        reaction.observe(self.handshake_sent, arrived, pcm.size / SAMPLE_RATE)
                        self.server.metrics.client_reaction.set(reaction.estimate)
                        self.handshake_sent = None
                    actor.push_input(lease, pcm, arrived)
                    decoded += pcm.size
            self.stats.frames_decoded = decoded // frame_size

    @contextlib.contextmanager
    def open_encoder(self) -> Iterator[None]:
        pool = self.server.encoder_pool
        self._stream = pool.open_stream()
        try:
            yield
        finally:
            pool.close_stream(self._stream)

    async def encode(self, items: list[OutputFrame]) -> list[Outgoing]:
        oggs = await self.server.encoder_pool.encode_many(self._stream, [frame.pcm for frame in items])
        messages: list[Outgoing] = []
        for frame, ogg in zip(items, oggs):
            if ogg:
                messages.append((moshi.audio(ogg), frame_times(frame)))
                self.stats.frames_sent += 1
            if frame.text:
                messages.append((moshi.text(frame.text), None))
                self.stats.text_sent += 1
        return messages
