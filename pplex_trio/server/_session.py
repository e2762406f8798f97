"""One WebSocket conversation: admission, then receive / process / send tasks.

A session is a small Trio nursery around a :class:`~pplex_trio.engine.Lease`:

    socket → receive → [inbound] → decode → [engine input framer]
    engine → [lease.outbox] → send (encode, write) → socket

Every hop is a bounded queue that drops the oldest item when full, so a slow
stage costs audio, never latency.  The send task encodes as well: a frame
goes out as soon as it is encoded, without one more task switch, and a client
that reads slowly makes the engine's outbox drop raw frames before any are
encoded, so the Opus stream stays whole.  Whoever ends the session first (a protocol
error, an engine failure, a shutdown, the end of a flush) calls :meth:`end`,
which records the close code and cancels the rest.  A client that disconnects
cancels the whole handler (Quart does that); ``finally`` blocks release the
slot, which then drains before anyone else gets it.

The protocol specifics (Moshi/Ogg Opus vs raw PCM) live in subclasses.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import itertools
import math
import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .._channel import DropOldestChannel
from ..engine import Conversation, Lease, LeaseState, OutputFrame, QueueFull
from ..protocol import CloseCode, ProtocolError

if TYPE_CHECKING:
    from ._state import ServerState

logger = logging.getLogger(__name__)
_ids = itertools.count(1)
STAGE_SAMPLING = 4  # one frame in this many feeds the per-stage latency histograms


class WebSocket(Protocol):
    """The part of Quart's websocket object a session uses."""

    query_string: bytes

    async def accept(self) -> None: ...
    async def receive(self) -> bytes | str | None: ...
    async def send(self, data: bytes | str) -> None: ...
    async def close(self, code: int, reason: str = "") -> None: ...


@dataclasses.dataclass(frozen=True)
class FrameTimes:
    """When one output frame passed each stage (Trio clock), for the latency metrics."""

    input_arrival: float
    tick_started: float
    step_seconds: float
    delivered: float
    encoded: float


# A message for the socket, and the times of the frame it carries (None if it
# carries no input frame's answer).
Outgoing = tuple[bytes | str, "FrameTimes | None"]


def frame_times(frame: OutputFrame) -> FrameTimes | None:
    """Call when the frame's message is encoded, ready to send."""
    if frame.input_arrival is None:
        return None
    return FrameTimes(frame.input_arrival, frame.tick_started, frame.step_seconds, frame.delivered,
                      trio.current_time())


@dataclasses.dataclass(frozen=True)
class Ending:
    code: int
    message: str | None  # told to the client before the close, if any
    outcome: str  # metrics label


@dataclasses.dataclass
class SessionStats:
    """Per-session counters, shown by ``/api/sessions``."""

    frames_decoded: int = 0  # input audio, in 1920-sample frames
    frames_sent: int = 0  # output audio frames
    text_sent: int = 0
    messages_received: int = 0
    messages_ignored: int = 0


class Session(abc.ABC):
    protocol: str  # "moshi" or "raw"
    align_input = False  # phase-aligned framing (see InputFramer)

    def __init__(self, ws: WebSocket, server: ServerState):
        self.id = next(_ids)
        self.ws = ws
        self.server = server
        self.settings = server.settings
        self.stats = SessionStats()
        self.lease: Lease | None = None
        self._ending: Ending | None = None
        self._scope = trio.CancelScope()
        self._drop = server.metrics.drop
        self.output_complete = False  # the protocol has encoded its last message
        self.handshake_sent: float | None = None  # set for aligned input until its first page

    # -- what protocols provide ---------------------------------------------

    @abc.abstractmethod
    async def negotiate(self) -> Conversation:
        """Read the client's conversation settings (raise ProtocolError if bad)."""

    @abc.abstractmethod
    async def keepalive(self, lease: Lease) -> None:
        """Tell a waiting client it is still queued / being prepared."""

    @abc.abstractmethod
    async def send_ready(self) -> None: ...

    @abc.abstractmethod
    async def receive_loop(self, inbound: DropOldestChannel[Any]) -> None: ...

    @abc.abstractmethod
    async def decode_loop(self, inbound: DropOldestChannel[Any], lease: Lease) -> None: ...

    @abc.abstractmethod
    async def encode(self, items: list[Any]) -> list[Outgoing]:
        """Turn what the engine's outbox held into messages (with their latency origin).

        Set ``output_complete`` once the last message of the conversation is among them.
        """

    def open_encoder(self) -> contextlib.AbstractContextManager[Any]:
        """Per-conversation encoder state, held while the send task runs."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    def error_message(self, message: str) -> bytes | str: ...

    # -- the common life cycle ------------------------------------------------

    def end(self, code: int, message: str | None, outcome: str) -> None:
        """End the session (the first caller's reason wins)."""
        if self._ending is None:
            self._ending = Ending(code, message, outcome)
        self._scope.cancel()

    async def run(self) -> None:
        metrics = self.server.metrics
        metrics.sessions_started.labels(self.protocol).inc()
        self.server.sessions.add(self)
        outcome = "client_closed"
        try:
            await self.ws.accept()
            with self._scope:
                if self.server.shutting_down:
                    self.end(CloseCode.GOING_AWAY, "server is shutting down", "shutdown")
                await self._converse()
            if self._ending is not None:
                outcome = self._ending.outcome
                await self._close(self._ending)
        finally:
            self.server.sessions.discard(self)
            metrics.sessions_ended.labels(self.protocol, outcome).inc()
            logger.info("session %d (%s) ended: %s", self.id, self.protocol, outcome)

    async def _converse(self) -> None:
        try:
            conversation = await self.negotiate()
        except ProtocolError as exc:
            self.server.metrics.errors.labels("bad_request").inc()
            self.end(exc.code, exc.message, "bad_request")
            return
        if conversation.voice is not None and conversation.voice not in self.server.voices():
            self.server.metrics.errors.labels("bad_request").inc()
            self.end(
                CloseCode.POLICY,
                f"unknown voice_prompt {conversation.voice!r}: see /api/voices for the voices this server has",
                "bad_request",
            )
            return
        with contextlib.ExitStack() as stack:
            try:
                lease = stack.enter_context(self.server.actor.lease(conversation, align=self.align_input))
            except QueueFull as exc:
                self.end(CloseCode.TRY_AGAIN_LATER, str(exc), "queue_full")
                return
            self.lease = lease
            await self._run_conversation(lease)

    async def _wait_until_live(self, lease: Lease) -> bool:
        """Wait in the queue, then through the prefill, keeping the client informed."""
        with trio.move_on_after(self.settings.queue_timeout) as queue_timer:
            while lease.state is LeaseState.QUEUED:
                await self.keepalive(lease)
                with trio.move_on_after(self.settings.keepalive_interval):
                    await lease.wait_changed()
        if queue_timer.cancelled_caught:
            self.end(
                CloseCode.TRY_AGAIN_LATER,
                f"no conversation slot became free within {self.settings.queue_timeout:g} s; try again later",
                "queue_timeout",
            )
            return False
        while lease.state is LeaseState.PREFILL and lease.failure is None:
            await self.keepalive(lease)
            with trio.move_on_after(self.settings.keepalive_interval):
                await lease.wait_changed()
        if lease.failure is not None:
            self._end_from_failure(lease)
            return False
        return lease.state is LeaseState.LIVE

    async def _run_conversation(self, lease: Lease) -> None:
        s = self.settings
        inbound: DropOldestChannel[Any] = DropOldestChannel(s.input_backlog_frames * 2, name="inbound", on_drop=self._drop)
        async with trio.open_nursery() as nursery:
            # The client is read from the start, so a protocol error or a
            # disconnect is noticed while it waits too (input before "live" is
            # decoded, to keep the stream's state, and then dropped).
            nursery.start_soon(self._guard, self.receive_loop, inbound)
            nursery.start_soon(self._guard, self.decode_loop, inbound, lease)
            if not await self._wait_until_live(lease):
                nursery.cancel_scope.cancel()
                return
            if self.align_input:
                # Pages of a client that starts streaming at the handshake land
                # just ahead of the ticks (see EngineActor.sleep_until_before_tick).
                actor = self.server.actor
                await actor.sleep_until_before_tick(actor.phase.margin + self.server.client_reaction.estimate)
                self.handshake_sent = trio.current_time()
            await self.send_ready()
            nursery.start_soon(self._guard, self._send_loop, lease)
            nursery.start_soon(self._watch_failure, lease)

    async def _guard(self, fn: Any, *args: Any) -> None:
        """Run one pipeline task; turn its ProtocolError into the session's ending."""
        try:
            await fn(*args)
        except ProtocolError as exc:
            self.server.metrics.errors.labels("protocol").inc()
            self.end(exc.code, exc.message, "protocol_error")
        except Exception:
            logger.exception("session %d: internal error in %s", self.id, getattr(fn, "__name__", fn))
            self.server.metrics.errors.labels("session").inc()
            self.end(CloseCode.INTERNAL_ERROR, "internal server error in this conversation; please reconnect",
                     "internal_error")

    async def _send_loop(self, lease: Lease) -> None:
        metrics = self.server.metrics
        stage = {name: metrics.latency_stage.labels(name) for name in ("wait_for_tick", "tick", "encode", "send")}
        timeout = self.settings.send_timeout
        observed = 0
        # One cancel scope for the whole loop, its deadline moved per message:
        # a new scope per message costs more than the send itself.
        with self.open_encoder(), trio.CancelScope() as timer:
            while not self.output_complete:
                try:
                    items = await lease.outbox.receive_batch()
                except trio.EndOfChannel:
                    return  # the slot was released: the session is ending anyway
                for message, times in await self.encode(items):
                    timer.deadline = trio.current_time() + timeout
                    await self.ws.send(message)
                    timer.deadline = math.inf
                    if times is None:
                        continue
                    sent = trio.current_time()
                    metrics.added_latency.observe(sent - times.input_arrival - times.step_seconds)
                    observed += 1
                    if observed % STAGE_SAMPLING == 0:  # the split by stage needs fewer samples
                        stage["wait_for_tick"].observe(times.tick_started - times.input_arrival)
                        stage["tick"].observe(times.delivered - times.tick_started - times.step_seconds)
                        stage["encode"].observe(times.encoded - times.delivered)
                        stage["send"].observe(sent - times.encoded)
        if timer.cancelled_caught:
            self.end(CloseCode.POLICY, "client did not read its messages in time", "send_timeout")
            return
        # The protocol sent its last message: everything is out, a normal end.
        self.end(CloseCode.NORMAL, None, "completed")

    async def _watch_failure(self, lease: Lease) -> None:
        while lease.failure is None:
            await lease.wait_changed()
        self._end_from_failure(lease)

    def _end_from_failure(self, lease: Lease) -> None:
        assert lease.failure is not None
        outcome = "engine_error" if lease.failure.code == CloseCode.INTERNAL_ERROR else "rejected"
        self.end(lease.failure.code, lease.failure.message, outcome)

    async def _close(self, ending: Ending) -> None:
        # The client may be gone or stuck: never wait long on it.
        with trio.move_on_after(1.0):
            if ending.message is not None:
                await self.ws.send(self.error_message(ending.message))
            await self.ws.close(ending.code, close_reason(ending.message))
            # Read on until the client answers the close (Quart then cancels
            # us): a socket closed with the client's audio still unread would
            # be reset, and the client might never see why it ended.
            while await self.ws.receive() is not None:
                pass

    def describe(self) -> dict[str, Any]:
        lease = self.lease
        ms = 1000 / self.server.engine.sample_rate  # per sample
        return {
            "id": self.id,
            "protocol": self.protocol,
            "state": lease.state.value if lease else "negotiating",
            "slot": lease.slot if lease else None,
            "queue_position": lease.position if lease and lease.state is LeaseState.QUEUED else None,
            **dataclasses.asdict(self.stats),
            "frames_consumed": lease.frames_consumed if lease else 0,
            "input_backlog_ms": round(lease.framer.pending_samples * ms, 1) if lease else 0.0,
            "input_margin_ms": round(lease.framer.margin * ms, 1) if lease else 0.0,
            "input_underruns": lease.framer.underruns if lease else 0,
            "input_skipped_ms": round(lease.framer.skipped_samples * ms, 1) if lease else 0.0,
        }


def close_reason(message: str | None) -> str:
    """A close frame's reason must fit in 123 bytes of UTF-8."""
    data = (message or "").encode("utf-8")[:123]
    return data.decode("utf-8", errors="ignore")
