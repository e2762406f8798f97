"""Reading from a client: the opening messages, then a session's receive and process tasks.

The receive task parses each message as it arrives and queues its audio,
still encoded, stamped with its arrival time, in the **inbound** queue (a
drop-oldest channel weighed in bytes: a burst after a stall comes whole, up
to the input backlog, and no client floods memory); answers to control
messages go out at once, through the session's ``reply``.  The process task
decodes what waited and pushes it to the lease; at the end of input it
flushes.  Neither ends the session itself: each returns why it stopped
(:class:`InputEnd`), and the session decides (``_session.py``).  The
outbound half is ``_sender.py``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..._channel import DropOldestChannel
from ..._conversation import SAMPLE_RATE, Conversation
from ...engine import PREPARING_STATES, Lease, LeaseFailed, LeaseState
from .._settings import ServerSettings
from ._wire import (
    EndOfInput,
    Hangup,
    InputAudio,
    Message,
    OpensWithMessage,
    Replies,
    Restart,
    ResumeCall,
    WebSocket,
    WireProtocol,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SessionStats:
    """Per-session counters, shown by ``/api/sessions``."""

    frames_decoded: int = 0  # input audio taken by the engine, in 1920-sample frames
    messages_received: int = 0
    messages_ignored: int = 0


class InputEnd(enum.Enum):
    """Why a task of the receiver stopped."""

    HANGUP = enum.auto()  # the caller hung up: nothing to flush, nobody is listening
    FLUSHED = enum.auto()  # the input ended: the lease flushes, and the output ends once all is answered
    UNHEARD = enum.auto()  # the input ended before the conversation began, and nothing of it was kept
    LEASE_FAILED = enum.auto()  # the server ended the conversation (the lease's ``failure`` says why)


class Receiver:
    """One session's reads: :meth:`opening` while it is admitted, then :meth:`receive` and :meth:`process`."""

    def __init__(
        self,
        ws: WebSocket,
        wire: WireProtocol,
        settings: ServerSettings,
        *,
        name: str,
        frame_size: int,
        reply: Callable[[Message], Awaitable[None]],
        on_drop: Callable[[str], None],
    ):
        self.ws = ws
        self.wire = wire
        self.name = name  # for its log lines: "session 3 (raw)"
        self.stats = SessionStats()
        self._frame_size = frame_size
        self._reply = reply
        self._inbound: DropOldestChannel[tuple[float, Any]] = DropOldestChannel(
            settings.max_message_bytes + int(settings.input_backlog_seconds * SAMPLE_RATE * 4),
            name="inbound",
            on_drop=on_drop,
            weigh=_payload_bytes,
        )
        self._opened_at = 0.0  # when the opening message that gave the conversation arrived
        self._samples_pushed = 0

    async def opening(self, wire: OpensWithMessage) -> Conversation | ResumeCall | Hangup:
        """Read the opening messages until the protocol has the conversation's settings (or the call ended)."""
        while True:
            message = await self.ws.receive()
            self.stats.messages_received += 1
            step = wire.opening(self.ws.query_string, message)
            self._log_notices()
            if isinstance(step, Hangup):
                return step
            if isinstance(step, Conversation | ResumeCall):
                self._opened_at = trio.current_time()
                return step
            for reply in step.messages:
                await self._reply(reply)

    def keep_opening_audio(self) -> None:
        """The first words may be in the message that opened the conversation: they are queued first."""
        audio = self.wire.opening_audio()
        if audio is not None:
            self._inbound.send_nowait((self._opened_at, audio.payload))

    async def receive(self, lease: Lease) -> InputEnd:
        """Socket → parsed events → the inbound queue (audio payloads, still encoded), until the caller hangs
        up.  Error handling: a bad message raises ``ProtocolError``."""
        wire, stats = self.wire, self.stats
        while True:
            message = await self.ws.receive()
            stats.messages_received += 1
            arrived = trio.current_time()
            event = wire.parse(message)
            self._log_notices()
            if isinstance(event, InputAudio):
                self._inbound.send_nowait((arrived, event.payload))
            elif isinstance(event, EndOfInput):
                self._inbound.close()  # the process task flushes once it has passed everything on
            elif isinstance(event, Hangup):
                return InputEnd.HANGUP
            elif isinstance(event, Replies):
                for reply in event.messages:
                    await self._reply(reply)
            elif isinstance(event, Restart):
                if lease.restart(event.conversation):
                    logger.info("%s: new settings; the system prompt runs again", self.name)
                for reply in event.messages:
                    await self._reply(reply)
            else:
                stats.messages_ignored += 1

    async def process(self, lease: Lease) -> InputEnd:
        """Decode what arrived and push it to the lease; at the end of input, flush."""
        while True:
            try:
                batch = await self._inbound.receive_batch()
            except trio.EndOfChannel:
                break
            pcms = self.wire.decode([payload for _, payload in batch])
            try:
                for (arrived, _), pcm in zip(batch, pcms):
                    if pcm.size and lease.push_input(pcm, arrived):
                        self._samples_pushed += pcm.size
            except LeaseFailed:
                return InputEnd.LEASE_FAILED
            self.stats.frames_decoded = self._samples_pushed // self._frame_size
        if (lease.state is LeaseState.QUEUED or lease.state in PREPARING_STATES) and not lease.early_audio_kept:
            return InputEnd.UNHEARD
        lease.flush()  # (audio kept from before "live" is answered once the conversation is)
        return InputEnd.FLUSHED

    def _log_notices(self) -> None:
        for notice in self.wire.take_notices():
            logger.info("%s: %s", self.name, notice)


def _payload_bytes(item: tuple[float, Any]) -> int:
    """What an undecoded message weighs in the inbound queue (a message's bytes, or a raw array's)."""
    payload = item[1]
    return int(payload.nbytes) if hasattr(payload, "nbytes") else len(payload)
