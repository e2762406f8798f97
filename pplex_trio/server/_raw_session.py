"""The raw PCM session (``/v1/audio/duplex``): float32 in and out, JSON control.

For tools and tests that want exact samples, not Opus.  The client opens with
``{"type": "open", ...}``; ``{"type": "close"}`` flushes pending input through
the engine, answers ``{"type": "done"}`` and closes.
"""

from __future__ import annotations

from typing import Any

import trio

from .._channel import DropOldestChannel
from ..engine import Conversation, Lease, LeaseState, OutputFrame
from ..protocol import CloseCode, ProtocolError, conversation_from_params, raw
from ._session import Outgoing, Session, frame_times

_FLUSHED = object()  # marks the end of a flush in the output pipeline


class RawSession(Session):
    protocol = "raw"

    async def negotiate(self) -> Conversation:
        max_bytes = self.settings.max_message_bytes
        with trio.move_on_after(self.settings.open_timeout):
            message = await self.ws.receive()
            self.stats.messages_received += 1
            event = raw.parse_client_message(message, max_bytes=max_bytes)
            if not isinstance(event, raw.Open):
                raise ProtocolError('the first message must be {"type": "open", ...}', CloseCode.POLICY)
            return conversation_from_params(event.params, max_prompt_chars=self.settings.max_prompt_chars)
        raise ProtocolError(
            f'no {{"type": "open"}} message within {self.settings.open_timeout:g} s', CloseCode.POLICY
        )

    async def keepalive(self, lease: Lease) -> None:
        if lease.position:
            await self.ws.send(raw.queued(lease.position))

    async def send_ready(self) -> None:
        await self.ws.send(raw.ready())

    def error_message(self, message: str) -> str:
        return raw.error(message)

    async def receive_loop(self, inbound: DropOldestChannel[Any]) -> None:
        max_bytes = self.settings.max_message_bytes
        closing = False
        while True:
            message = await self.ws.receive()
            self.stats.messages_received += 1
            arrived = trio.current_time()
            event = raw.parse_client_message(message, max_bytes=max_bytes)
            if isinstance(event, raw.PcmReceived):
                if closing:
                    raise ProtocolError("audio after \"close\": nothing may follow a close", CloseCode.POLICY)
                if event.pcm.size:
                    inbound.send_nowait((arrived, event.pcm))
            elif isinstance(event, raw.Close):
                if not closing:
                    closing = True
                    inbound.close()  # the decode loop flushes once it has passed everything on
            else:
                raise ProtocolError("the conversation is already open", CloseCode.POLICY)

    async def decode_loop(self, inbound: DropOldestChannel[Any], lease: Lease) -> None:
        actor = self.server.actor
        frame_size = actor.engine.frame_size
        received = 0
        async for arrived, pcm in inbound:
            if lease.state is not LeaseState.LIVE:
                continue  # not ready yet: the client should have waited for "ready"
            actor.push_input(lease, pcm, arrived)
            received += pcm.size
            self.stats.frames_decoded = received // frame_size
        if lease.state is not LeaseState.LIVE:
            self.end(CloseCode.NORMAL, None, "completed")  # closed before it began
            return
        await self._flush(lease)

    async def _flush(self, lease: Lease) -> None:
        """Run what is pending through the engine, then mark the end of the output."""
        lease.framer.pad_to_frame()
        while lease.framer.pending_frames or lease.last_delivered_tick < lease.last_consumed_tick:
            await lease.wait_changed()
        lease.outbox.send_nowait(_FLUSHED, droppable=False)  # type: ignore[arg-type]

    async def encode(self, items: list[Any]) -> list[Outgoing]:
        messages: list[Outgoing] = []
        for frame in items:
            if frame is _FLUSHED:
                messages.append((raw.done(), None))
                self.output_complete = True
                break
            assert isinstance(frame, OutputFrame)
            messages.append((raw.pcm_frame(frame.pcm), frame_times(frame)))
            self.stats.frames_sent += 1
            if frame.text:
                messages.append((raw.text(frame.text), None))
                self.stats.text_sent += 1
        return messages
