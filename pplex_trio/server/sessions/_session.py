"""One WebSocket conversation: the session core that every wire protocol shares.

A session is an explicit state machine around a :class:`~pplex_trio.engine.Lease`:

    ADMITTING → QUEUED → PREPARING → LIVE → CLOSING → CLOSED

(QUEUED and PREPARING are its lease's states, shown until the handshake; QUEUED is skipped
when a slot is free; any state may go to CLOSING when the session ends, and to CLOSED when the
connection is gone).  While it waits and while it is live, it is a small Trio nursery of three
tasks joined by bounded queues that drop the oldest item when full, so a slow stage costs
audio, never latency:

    socket → receive → [inbound] → process (decode) → lease.push_input → engine
    engine → lease.frames() → send (encode, write) → socket

The send task (``_sender.py``) encodes as well.  Whoever ends the session first
(a protocol error, an engine failure, a shutdown, the end of a flush) calls
:meth:`Session.end`, which records why and cancels the rest; the session then
tells the client why and closes.  A client that disconnects cancels the whole
handler (``AsgiWebSocket`` does that); leaving the lease's block gives the slot back,
which drains before anyone else gets it.

Every session meters its conversation's quality (:class:`~pplex_trio.codec.ConversationQuality`:
response latency, talk-over, dead air, the agent's share, barge-ins) from the lease's
frames, for ``/api/sessions``, the metrics, the end-of-call log line and the record.
With ``--record`` a :class:`~pplex_trio.server.records._recorder.Recorder` observes
the lease's frames, writes them from a fourth task, and is finished once the
client has been told (whatever the ending): every protocol is recorded alike.

What differs between protocols is a :class:`~pplex_trio.server.sessions._wire.WireProtocol`:
pure codec calls plus a few specifics.  See ``docs/ARCHITECTURE.md``.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
from typing import Any, Protocol

import trio

from ..._channel import DropOldestChannel
from ..._conversation import SAMPLE_RATE, CloseCode, Conversation
from ..._lifecycle import Lifecycle
from ..._metrics import Metrics
from ...codec import ConversationQuality, Response
from ...engine import (BEGUN_STATES, PREPARING_STATES, EngineActor, Lease, LeaseFailed, LeaseState, OutputFrame,
                      QueueFull)
from ...protocol import ProtocolError
from ..records import CallEnding, Recorder, RecordStore
from .._server_state import Unready
from .._settings import ServerSettings
from ._sender import Sender, StreamEnd
from ._wire import EndOfInput, Hangup, InputAudio, Message, OpensWithMessage, Replies, Restart, WebSocket, Wire

logger = logging.getLogger(__name__)
_ids = itertools.count(1)


class SessionHost(Protocol):
    """What a session needs of its server (``ServerContext`` is one)."""

    settings: ServerSettings
    actor: EngineActor
    metrics: Metrics
    sessions: set[Session]
    records: RecordStore | None

    def unready(self, *, when_full: bool = True) -> Unready | None: ...


class SessionState(enum.Enum):
    """What ``/api/sessions`` shows.  A session keeps only its own steps (admitting, live, closing, closed);
    between its settings and its handshake, its state is its lease's (queued, then preparing)."""

    ADMITTING = "admitting"  # accepted; reading and checking the conversation's settings
    QUEUED = "queued"  # (the lease's) waiting for a slot
    PREPARING = "preparing"  # (the lease's) the slot runs the system prompt
    LIVE = "live"  # the handshake is sent: audio both ways
    CLOSING = "closing"  # telling the client why, closing the socket
    CLOSED = "closed"


# The session's own steps (QUEUED and PREPARING are its lease's): a client that vanishes ends it from any of them.
SESSION_LIFECYCLE = Lifecycle("session", SessionState.ADMITTING, {
    SessionState.ADMITTING: {SessionState.LIVE, SessionState.CLOSING, SessionState.CLOSED},
    SessionState.LIVE: {SessionState.CLOSING, SessionState.CLOSED},
    SessionState.CLOSING: {SessionState.CLOSED},
    SessionState.CLOSED: set(),
    SessionState.QUEUED: set(), SessionState.PREPARING: set(),  # (never the session's own step)
})


@dataclasses.dataclass(frozen=True)
class Ending:
    code: CloseCode
    message: str | None  # told to the client before the close, if any
    outcome: str  # metrics label


@dataclasses.dataclass
class SessionStats:
    """Per-session counters, shown by ``/api/sessions``."""

    frames_decoded: int = 0  # input audio taken by the engine, in 1920-sample frames
    messages_received: int = 0
    messages_ignored: int = 0


class Session:
    """One conversation over one WebSocket, speaking ``wire``."""

    def __init__(self, ws: WebSocket, wire: Wire, host: SessionHost):
        self.id = next(_ids)
        self.ws = ws
        self.wire = wire
        self.host = host
        self.settings = host.settings
        self.stats = SessionStats()
        self._sender = Sender(ws, wire, host.metrics, timeout=self.settings.client_timeout)
        self._step = SESSION_LIFECYCLE.start  # the session's own step; see `state`
        self.lease: Lease | None = None
        self.ending: Ending | None = None
        self.recorder: Recorder | None = None  # (--record)
        self.quality = ConversationQuality()
        self._scope = trio.CancelScope()
        self._samples_pushed = 0
        self._opened_at = 0.0  # when the opening message that gave the conversation arrived
        self.started_at: float | None = None  # when it ran (trio.current_time): its age on the status page

    @property
    def protocol(self) -> str:
        return self.wire.name

    # -- the state machine ---------------------------------------------------

    @property
    def state(self) -> SessionState:
        if self._step is SessionState.ADMITTING and self.lease is not None:
            return SessionState.QUEUED if self.lease.state is LeaseState.QUEUED else SessionState.PREPARING
        return self._step

    def _enter(self, step: SessionState) -> None:
        self._step = SESSION_LIFECYCLE.move(self._step, step)

    def end(self, code: CloseCode, message: str | None, outcome: str) -> None:
        """End the session (the first caller's reason wins)."""
        if self.ending is None:
            self.ending = Ending(code, message, outcome)
        self._scope.cancel()

    async def run(self) -> None:
        host = self.host
        self.started_at = trio.current_time()
        host.metrics.sessions_started.labels(self.protocol).inc()
        host.sessions.add(self)
        outcome = "client_closed"
        try:
            await self.ws.accept(subprotocol=self.wire.subprotocol)
            with self._scope:
                unready = host.unready(when_full=False)
                if unready in (Unready.SHUTTING_DOWN, Unready.DRAINING):
                    assert unready is not None
                    self.end(CloseCode.GOING_AWAY, unready.message,
                             "shutdown" if unready is Unready.SHUTTING_DOWN else "draining")
                else:
                    try:
                        await self._converse()
                    except Exception:  # a bug met in this conversation ends this conversation only
                        logger.exception("session %d (%s): internal error", self.id, self.protocol)
                        host.metrics.errors.labels("session").inc()
                        self.end(CloseCode.INTERNAL_ERROR,
                                 "internal server error in this conversation; please reconnect", "internal_error")
            if self.ending is not None:
                outcome = self.ending.outcome
                self._enter(SessionState.CLOSING)
                await self._sender.close(self.ending.code, self.ending.message, outcome)
        finally:
            self._enter(SessionState.CLOSED)
            host.sessions.discard(self)
            host.metrics.sessions_ended.labels(self.protocol, outcome).inc()
            logger.info("session %d (%s) ended: %s%s", self.id, self.protocol, outcome, self._finish_quality())
            if self.recorder is not None:  # (after the close: a slow disk never delays it)
                await self.recorder.finish(self._call_ending(outcome))

    async def _converse(self) -> None:
        conversation = await self._admit()
        if conversation is None:
            return
        if self.host.unready(when_full=False) is Unready.ENGINE_STALLED:
            self.end(CloseCode.TRY_AGAIN_LATER, Unready.ENGINE_STALLED.message, "engine_stalled")
            return
        if self.host.records is not None:
            self.recorder = self.host.records.recorder(self.id, self.protocol, conversation)
        try:
            with self.host.actor.lease(conversation, align=self.wire.align_input, early_audio=self.wire.early_audio,
                                       client=self.ws.client, on_frame=self._on_frame) as lease:
                self.lease = lease
                try:
                    await self._run_conversation(lease)
                finally:
                    # The client left (or finished): its slot waits a moment for it to come back.
                    lease.end(client_left=self.ending is None or self.ending.outcome == "completed")
        except QueueFull as exc:
            self.end(CloseCode.TRY_AGAIN_LATER, str(exc), "queue_full")

    async def _admit(self) -> Conversation | None:
        """ADMITTING: the conversation's settings, checked (None: the session has ended)."""
        try:
            for message in self.wire.greeting():
                await self._send_control(message)
            if isinstance(self.wire, OpensWithMessage):
                conversation: Conversation | Hangup | None = None
                timeout = self.settings.open_timeout
                with trio.move_on_after(timeout):
                    conversation = await self._opening(self.wire)
                if conversation is None:
                    raise ProtocolError(f"no opening message within {timeout:g} s: {self.wire.opening_hint}")
                if isinstance(conversation, Hangup):
                    self.end(CloseCode.NORMAL, None, "hangup")
                    return None
            else:
                conversation = self.wire.conversation(self.ws.query_string)
        except ProtocolError as exc:
            self.host.metrics.errors.labels("bad_request").inc()
            self.end(exc.code, exc.message, "bad_request")
            return None
        return conversation

    async def _opening(self, wire: OpensWithMessage) -> Conversation | Hangup:
        """Read the opening messages until the protocol has the conversation's settings (or the call ended)."""
        while True:
            message = await self.ws.receive()
            self.stats.messages_received += 1
            step = wire.opening(self.ws.query_string, message)
            self._log_notices()
            if isinstance(step, Hangup):
                return step
            if isinstance(step, Conversation):
                self._opened_at = trio.current_time()
                return step
            for reply in step.messages:
                await self._send_control(reply)

    async def _run_conversation(self, lease: Lease) -> None:
        s = self.settings
        # What arrived and is not decoded yet: a burst after a stall comes whole (up to the input backlog, in
        # float32 PCM's bytes: more than any codec's), and no client floods memory.
        inbound: DropOldestChannel[tuple[float, Any]] = DropOldestChannel(
            s.max_message_bytes + int(s.input_backlog_seconds * SAMPLE_RATE * 4), name="inbound",
            on_drop=self.host.metrics.drop, weigh=_payload_bytes)
        audio = self.wire.opening_audio()
        if audio is not None:  # the first words may be in the message that opened the conversation
            inbound.send_nowait((self._opened_at, audio.payload))
        async with trio.open_nursery() as nursery:
            if self.recorder is not None:
                nursery.start_soon(self.recorder.run)
            # Read from the start: errors and disconnects are seen while waiting (early input is decoded, then dropped).
            nursery.start_soon(self._guard, self._receive_loop, inbound, lease)
            nursery.start_soon(self._guard, self._process_loop, inbound, lease)
            if not await self._wait_until_live(lease):
                nursery.cancel_scope.cancel()
                return
            if self.wire.align_input:
                # A client streaming from the handshake lands just ahead of the ticks (sleep_until_handshake).
                await lease.sleep_until_handshake()
            for message in self.wire.ready():
                await self._send_control(message)
            if self.wire.begins_at_once():
                lease.begin()
            self._enter(SessionState.LIVE)
            nursery.start_soon(self._guard, self._send_loop, lease)
            nursery.start_soon(self._watch_failure, lease)
            if s.max_session_seconds:
                nursery.start_soon(self._time_limit, s.max_session_seconds)

    async def _wait_until_live(self, lease: Lease) -> bool:
        """QUEUED, then PREPARING: keep the client informed until the lease is LIVE."""
        interval = self.settings.keepalive_interval
        with trio.move_on_after(self.settings.queue_timeout) as queue_timer:
            while lease.state is LeaseState.QUEUED and lease.failure is None:
                await self._keepalive(lease.position)
                with trio.move_on_after(interval):
                    await lease.wait_changed()
        if queue_timer.cancelled_caught:
            self.end(CloseCode.TRY_AGAIN_LATER,
                     f"no conversation slot became free within {self.settings.queue_timeout:g} s; try again later",
                     "queue_timeout")
            return False
        while lease.state in PREPARING_STATES and lease.failure is None:
            await self._keepalive(None)
            with trio.move_on_after(interval):
                await lease.wait_changed()
        if lease.failure is not None:
            self._end_from_failure(lease)
            return False
        return lease.state in BEGUN_STATES

    def _log_notices(self) -> None:
        for notice in self.wire.take_notices():
            logger.info("session %d (%s): %s", self.id, self.protocol, notice)

    async def _keepalive(self, position: int | None) -> None:
        message = self.wire.keepalive(position)
        if message is not None:
            await self._send_control(message)

    async def _guard(self, fn: Any, *args: Any) -> None:
        """Run one pipeline task; turn its error into the session's ending (never the server's)."""
        try:
            await fn(*args)
        except ProtocolError as exc:
            self.host.metrics.errors.labels("protocol").inc()
            self.end(exc.code, exc.message, "protocol_error")
        except Exception:
            logger.exception("session %d: internal error in %s", self.id, getattr(fn, "__name__", fn))
            self.host.metrics.errors.labels("session").inc()
            self.end(CloseCode.INTERNAL_ERROR, "internal server error in this conversation; please reconnect",
                     "internal_error")

    # -- the three tasks -----------------------------------------------------

    async def _receive_loop(self, inbound: DropOldestChannel[tuple[float, Any]], lease: Lease) -> None:
        """Socket → parsed events → the inbound queue (audio payloads, still encoded)."""
        wire, stats = self.wire, self.stats
        while True:
            message = await self.ws.receive()
            stats.messages_received += 1
            arrived = trio.current_time()
            event = wire.parse(message)
            self._log_notices()
            if isinstance(event, InputAudio):
                inbound.send_nowait((arrived, event.payload))
            elif isinstance(event, EndOfInput):
                inbound.close()  # the process task flushes once it has passed everything on
            elif isinstance(event, Hangup):
                self.end(CloseCode.NORMAL, None, "hangup")  # nothing to flush: nobody is listening
                return
            elif isinstance(event, Replies):
                for reply in event.messages:
                    await self._send_control(reply)
            elif isinstance(event, Restart):
                if lease.restart(event.conversation):
                    logger.info("session %d (%s): new settings; the system prompt runs again", self.id,
                                self.protocol)
                for reply in event.messages:
                    await self._send_control(reply)
            else:
                stats.messages_ignored += 1

    async def _process_loop(self, inbound: DropOldestChannel[tuple[float, Any]], lease: Lease) -> None:
        """Decode what arrived and push it to the engine; at the end of input, flush."""
        frame_size = self.host.actor.engine.frame_size
        while True:
            try:
                batch = await inbound.receive_batch()
            except trio.EndOfChannel:
                break
            pcms = self.wire.decode([payload for _, payload in batch])
            try:
                for (arrived, _), pcm in zip(batch, pcms):
                    if pcm.size and lease.push_input(pcm, arrived):
                        self._samples_pushed += pcm.size
            except LeaseFailed:
                self._end_from_failure(lease)
                return
            self.stats.frames_decoded = self._samples_pushed // frame_size
        if (lease.state is LeaseState.QUEUED or lease.state in PREPARING_STATES) and not lease.early_audio_kept:
            self.end(CloseCode.NORMAL, None, "completed")  # the input ended before the conversation began
            return
        lease.flush()  # (audio kept from before "live" is answered once the conversation is)

    async def _send_loop(self, lease: Lease) -> None:
        """Engine output → encoded messages → socket, each write with a deadline."""
        end = await self._sender.stream(lease)
        if end is StreamEnd.CLIENT_TIMEOUT:
            self.end(CloseCode.POLICY, "client did not read its messages in time", "client_timeout")
        elif end is StreamEnd.COMPLETE:
            self.end(CloseCode.NORMAL, None, "completed")  # everything is out: a normal end
        # else: the lease ended, so the session is ending anyway

    async def _send_control(self, message: Message) -> None:
        """A message outside the audio stream (keepalive, ready), with the same deadline."""
        if not await self._sender.control(message):
            self.end(CloseCode.POLICY, "client did not read its messages in time", "client_timeout")
            await trio.lowlevel.checkpoint()  # the session's scope is cancelled: stop here

    async def _watch_failure(self, lease: Lease) -> None:
        while lease.failure is None:
            await lease.wait_changed()
        self._end_from_failure(lease)

    async def _time_limit(self, seconds: float) -> None:
        """``--max-session-seconds``: one conversation cannot hold a slot for ever."""
        await trio.sleep(seconds)
        self.end(CloseCode.NORMAL, f"this conversation reached the server's time limit of {seconds:g} s; "
                 "start a new one to go on", "time_limit")

    # -- the conversation's timeline -----------------------------------------

    def _on_frame(self, frame: OutputFrame) -> None:
        """The lease's observer (the actor's task, every frame, a few µs): the quality meter, and the recorder."""
        if self.recorder is not None:
            self.recorder.on_frame(frame)
        self._count(self.quality.feed(frame.heard, frame.pcm))

    def _count(self, events: tuple[object, ...]) -> None:
        for event in events:
            if isinstance(event, Response):
                self.host.metrics.response_latency.observe(event.seconds)
            else:
                self.host.metrics.barge_ins.inc()

    def _finish_quality(self) -> str:
        """The conversation is over: its last quality figures into the metrics; what the log line adds."""
        self._count(self.quality.finish())
        stats = self.quality.statistics()
        if not stats.frames:
            return ""  # (it never went live)
        metrics = self.host.metrics
        metrics.talk_over.observe(stats.talk_over_s)
        metrics.dead_air.observe(stats.dead_air_s)
        metrics.agent_share.observe(stats.agent_share)
        return f" ({stats.summary()})"

    def _end_from_failure(self, lease: Lease) -> None:
        assert lease.failure is not None
        outcome = "engine_error" if lease.failure.code == CloseCode.INTERNAL_ERROR else "rejected"
        self.end(lease.failure.code, lease.failure.message, outcome)

    def _call_ending(self, outcome: str) -> CallEnding:
        """What the call record says of how the call went."""
        lease, code = self.lease, None if self.ending is None else int(self.ending.code)
        quality = self.quality.statistics().as_dict()
        if lease is None:  # (the queue was full: nothing was recorded)
            assert self.recorder is not None
            return CallEnding(outcome=outcome, close_code=code, conversation=self.recorder.conversation,
                              details={**self.wire.call_details(), "quality": quality})
        inputs = lease.input_stats()
        ms = 1000 / self.host.actor.engine.sample_rate
        return CallEnding(
            outcome=outcome, close_code=code, conversation=lease.conversation,
            details={**self.wire.call_details(), "restarts": lease.restarts, "frames_sent": self._sender.frames_sent,
                      "output_dropped": lease.output_dropped, "output_skipped": lease.output_skipped,
                      "input_underruns": inputs.underruns, "input_skipped_ms": round(inputs.skipped * ms, 1),
                      "input_caught_up_ms": round(inputs.caught_up * ms, 1), "quality": quality})

    def describe(self) -> dict[str, Any]:
        lease = self.lease
        ms = 1000 / self.host.actor.engine.sample_rate  # per sample
        inputs = lease.input_stats() if lease else None
        return {
            "id": self.id,
            "protocol": self.protocol,
            "state": self.state.value,
            "slot": lease.slot if lease else None,
            "queue_position": lease.position if lease and lease.state is LeaseState.QUEUED else None,
            **dataclasses.asdict(self.stats),
            "frames_sent": self._sender.frames_sent,
            "text_sent": self._sender.text_sent,
            "frames_consumed": lease.frames_consumed if lease else 0,
            "input_backlog_ms": round(inputs.pending * ms, 1) if inputs else 0.0,
            "input_margin_ms": round(inputs.margin * ms, 1) if inputs else 0.0,
            "input_underruns": inputs.underruns if inputs else 0,
            "input_skipped_ms": round(inputs.skipped * ms, 1) if inputs else 0.0,
            "input_behind_ms": round(inputs.behind * ms, 1) if inputs else 0.0,
            "input_caught_up_ms": round(inputs.caught_up * ms, 1) if inputs else 0.0,
            "output_caught_up_frames": lease.output_skipped if lease else 0,
            "quality": self.quality.statistics().as_dict(),
            **self.wire.call_details(),  # (a phone call: the carrier's call, stream and account ids)
        }


def _payload_bytes(item: tuple[float, Any]) -> int:
    """What an undecoded message weighs in the inbound queue (a message's bytes, or a raw array's)."""
    payload = item[1]
    return int(payload.nbytes) if hasattr(payload, "nbytes") else len(payload)
