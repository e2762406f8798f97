"""One WebSocket conversation: the session core that every wire protocol shares.

A session is an explicit state machine around its end of a :class:`~pplex_trio.engine.Lease`:

    ADMITTING → LIVE → CLOSING → CLOSED

(any state may go to CLOSING when the session ends, and to CLOSED when the connection is gone;
between its settings and its handshake ``/api/sessions`` shows its lease's step instead: queued,
then preparing).  While it waits and while it is live, it is a small Trio nursery of three
tasks joined by bounded queues that drop the oldest item when full, so a slow stage costs
audio, never latency:

    socket → receive → [inbound] → process (decode) → lease.push_input → engine
    engine → lease.frames() → send (encode, write) → socket

The ``Receiver`` (``_receiver.py``) reads and decodes, the ``Sender`` (``_sender.py``) encodes and
writes.  Whoever ends the session first (a protocol error, an engine failure, a shutdown, the end
of a flush) calls :meth:`Session.end` with its :class:`~pplex_trio._conversation.Outcome`, which
records why and cancels the rest; the session then tells the client why and closes.  A client
that disconnects cancels the whole handler (``AsgiWebSocket`` does that); leaving the lease's
block gives the slot back, which drains before anyone else gets it.

The conversation's :class:`~pplex_trio.server.sessions._report.CallReport` observes the lease's
frames: its quality meter, both sides' words and, with ``--record``, its recorder (written from a
fourth task, finished once the client has been told).  It outlives a dropped connection: a call
paused for a resume parks it with its token, and the session that resumes the call adopts it
(or its lapse finishes it; ``_report.py``).

What differs between protocols is a :class:`~pplex_trio.server.sessions._wire.WireProtocol`:
pure codec calls plus a few specifics.  See ``docs/ARCHITECTURE.md``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any, Protocol

import trio

from ..._conversation import CloseCode, Conversation, Outcome
from ..._metrics import Metrics
from ...engine import BEGUN_STATES, PREPARING_STATES, EngineActor, Lease, LeaseState, QueueFull, ResumeRefused
from ...protocol import ProtocolError
from .._server_state import Unready
from .._settings import ServerSettings
from ..records import RecordStore
from ._lease_figures import lease_figures
from ._receiver import InputEnd, Receiver
from ._report import CallEnd, CallReport, ParkedCall
from ._sender import Sender, StreamEnd
from ._session_state import PAUSES
from ._session_state import SESSION_LIFECYCLE as SESSION_LIFECYCLE
from ._session_state import Ending as Ending
from ._session_state import SessionState as SessionState
from ._transcript import CallerTranscript
from ._wire import Hangup, Message, OpensWithMessage, ResumeCall, WebSocket, Wire

logger = logging.getLogger(__name__)
_ids = itertools.count(1)


class SessionHost(Protocol):
    """What a session needs of its server (``ServerContext`` is one)."""

    settings: ServerSettings
    actor: EngineActor
    metrics: Metrics
    sessions: set[Session]
    records: RecordStore | None

    def unready(self, *, when_full: bool = True) -> Unready | None:
        """Why the server takes no conversation now, None when it does (``when_full=False``: the queue answers)."""


class Session:
    """One conversation over one WebSocket, speaking ``wire``."""

    def __init__(self, ws: WebSocket, wire: Wire, host: SessionHost):
        self.id = next(_ids)
        self.ws = ws
        self.wire = wire
        self.host = host
        self.settings = host.settings
        self._sender = Sender(ws, wire, host.metrics, timeout=self.settings.client_timeout)
        self._receiver = Receiver(
            ws,
            wire,
            self.settings,
            name=f"session {self.id} ({wire.name})",
            frame_size=host.actor.engine.frame_size,
            reply=self._send_control,
            on_drop=host.metrics.drop,
        )
        self.stats = self._receiver.stats
        self._step = SESSION_LIFECYCLE.start  # the session's own step; see `state`
        self.lease: Lease | None = None
        self.ending: Ending | None = None
        # The quality meter, the caller's words (the adapters read them), and the recorder (--record).
        transcript = CallerTranscript(host.actor.engine.transcript_delay, self.settings.turn_end_threshold)
        self.report = CallReport(
            self.id, host.metrics, transcript, records=host.records, sample_rate=host.actor.engine.sample_rate
        )
        wire.hear(transcript.reader())
        self._scope = trio.CancelScope()
        self._resumed: ResumeCall | None = None  # the opening that resumed a paused conversation, if one did
        self._paused = False  # its call was paused for a resume: its report is parked, no longer this session's
        self.started_at: float | None = None  # when it ran (trio.current_time): its age on the status page

    @property
    def protocol(self) -> str:
        """Its wire protocol's name (the ``protocol`` label of the metrics)."""
        return self.wire.name

    # -- the state machine ---------------------------------------------------

    @property
    def state(self) -> SessionState:
        """Its own step (:data:`SESSION_LIFECYCLE`); :attr:`status` tells its lease's while it waits."""
        return self._step

    @property
    def status(self) -> str:
        """What ``/api/sessions`` shows: its own step, or, from its settings to its handshake, its lease's
        (``queued`` while it waits for a slot, then ``preparing``)."""
        lease = self.lease
        if self._step is SessionState.ADMITTING and lease is not None:
            return "queued" if lease.state is LeaseState.QUEUED else "preparing"
        return self._step.value

    def _enter(self, step: SessionState) -> None:
        self._step = SESSION_LIFECYCLE.move(self._step, step)

    def end(self, outcome: Outcome, message: str | None = None, *, code: CloseCode | None = None) -> None:
        """End the session (the first caller's reason wins), closing with ``code`` or else the outcome's."""
        if self.ending is None:
            code = code or outcome.code
            assert code is not None, f"{outcome} closes with no code of ours"
            self.ending = Ending(code, message, outcome)
        self._scope.cancel()

    async def run(self) -> None:
        """Accept, converse, tell the client why it ended and close, then finish the record; a bug ends it with 1011."""
        host = self.host
        self.started_at = trio.current_time()
        host.metrics.sessions_started.labels(self.protocol).inc()
        host.sessions.add(self)
        outcome = Outcome.CLIENT_CLOSED
        try:
            await self.ws.accept(subprotocol=self.wire.subprotocol)
            with self._scope:
                unready = host.unready(when_full=False)
                if unready in (Unready.SHUTTING_DOWN, Unready.DRAINING):
                    assert unready is not None
                    self.end(
                        Outcome.SHUTDOWN if unready is Unready.SHUTTING_DOWN else Outcome.DRAINING, unready.message
                    )
                else:
                    try:
                        await self._converse()
                    except Exception:  # a bug met in this conversation ends this conversation only
                        logger.exception("session %d (%s): internal error", self.id, self.protocol)
                        host.metrics.errors.labels("session").inc()
                        self.end(Outcome.INTERNAL_ERROR, "internal server error in this conversation; please reconnect")
            if self.ending is not None:
                outcome = self.ending.outcome
                self._enter(SessionState.CLOSING)
                await self._sender.close(self.ending.code, self.ending.message, outcome)
        finally:
            self._enter(SessionState.CLOSED)
            host.sessions.discard(self)
            host.metrics.sessions_ended.labels(self.protocol, outcome.value).inc()
            if self._paused:  # (the call goes on without this connection: whoever resumes it, or its lapse, ends it)
                logger.info("session %d (%s) dropped: %s; its call is paused", self.id, self.protocol, outcome.value)
            elif (ending := self.report.close(self._call_end(outcome))) and self.report.recorder is not None:
                await self.report.recorder.finish(ending)  # (after the close: a slow disk never delays it)

    def _call_end(self, outcome: Outcome) -> CallEnd:
        """How the call ends (``outcome``), as its log line and its record tell it."""
        sent = self.report.frames_sent_before + self._sender.frames_sent  # (by every connection it had)
        code = None if self.ending is None else int(self.ending.code)
        details = {**self.wire.call_details(), "frames_sent": sent}
        return CallEnd(f"session {self.id} ({self.protocol})", outcome, code, self.lease, details)

    async def _converse(self) -> None:
        opening = await self._admit()
        if opening is None:
            return
        if self.host.unready(when_full=False) is Unready.ENGINE_STALLED:
            self.end(Outcome.ENGINE_STALLED, Unready.ENGINE_STALLED.message)
            return
        if isinstance(opening, ResumeCall):
            await self._resume(opening)
            return
        if self.host.records is not None:
            self.report.recorder = self.host.records.recorder(self.id, self.protocol, opening)
        try:
            with self.host.actor.lease(
                opening,
                align=self.wire.align_input,
                early_audio=self.wire.early_audio,
                client=self.ws.client,
                on_frame=self.report.on_frame,
            ) as lease:
                await self._hold(lease)
        except QueueFull as exc:
            self.end(Outcome.QUEUE_FULL, str(exc))

    async def _resume(self, opening: ResumeCall) -> None:
        """A paused conversation taken over by this connection: the same conversation (its id, its settings),
        its model state as the dropped connection left it."""
        try:
            lease, parked = await self.host.actor.resumes.resume(opening.token)
            assert isinstance(parked, ParkedCall)  # (what _run_conversation issued the token with)
            self.report, self.id = parked.report, parked.report.id  # the call's report: meter, words, record go on
            if type(parked.wire) is not type(self.wire):  # (a token resumes its call on the endpoint that gave it)
                lease.end()
                raise ResumeRefused("refused", f"this resume token is not one of {self.protocol}'s")
        except ResumeRefused as exc:
            return self.end(Outcome.BAD_REQUEST, exc.message, code=CloseCode.POLICY)
        self.report.resumed(trio.current_time())
        self.wire.hear(self.report.transcript.reader(from_now=True))
        self._resumed = opening
        self.wire.resumes_from(parked.wire)
        await self._hold(lease)

    async def _hold(self, lease: Lease) -> None:
        """Run the conversation on ``lease``; then end it, or, when the connection dropped without ending the
        call, pause it for a resume (``--resume-seconds``)."""
        self.lease = lease
        try:
            await self._run_conversation(lease)
        finally:
            outcome = None if self.ending is None else self.ending.outcome
            if outcome in PAUSES and lease.pause():
                # (before any checkpoint: a resume or a lapse may take the report from the next one on)
                self.report.park(trio.current_time(), self._call_end(outcome or Outcome.CLIENT_CLOSED))
                self._paused = True
            else:  # the client left (or finished): its slot waits a moment for it to come back
                lease.end(client_left=outcome in (None, Outcome.COMPLETED))

    async def _admit(self) -> Conversation | ResumeCall | None:
        """ADMITTING: the conversation's settings, checked (None: the session has ended)."""
        try:
            if isinstance(self.wire, OpensWithMessage) and (resume := self.wire.resume_in_url(self.ws.query_string)):
                return resume
            for message in self.wire.greeting():
                await self._send_control(message)
            if isinstance(self.wire, OpensWithMessage):
                conversation: Conversation | ResumeCall | Hangup | None = None
                timeout = self.settings.open_timeout
                with trio.move_on_after(timeout):
                    conversation = await self._receiver.opening(self.wire)
                if conversation is None:
                    raise ProtocolError(f"no opening message within {timeout:g} s: {self.wire.opening_hint}")
                if isinstance(conversation, Hangup):
                    self.end(Outcome.HANGUP)
                    return None
            else:
                conversation = self.wire.conversation(self.ws.query_string)
        except ProtocolError as exc:
            self.host.metrics.errors.labels("bad_request").inc()
            self.end(Outcome.BAD_REQUEST, exc.message, code=exc.code)
            return None
        return conversation

    async def _run_conversation(self, lease: Lease) -> None:
        self._receiver.keep_opening_audio()
        async with trio.open_nursery() as nursery:
            if self.report.recorder is not None:
                nursery.start_soon(self.report.recorder.run)
            # Read from the start: errors and disconnects are seen while waiting (early input is decoded, then dropped).
            nursery.start_soon(self._guard, self._receive_task, lease)
            nursery.start_soon(self._guard, self._process_task, lease)
            if not await self._wait_until_live(lease):
                nursery.cancel_scope.cancel()
                return
            if self.wire.align_input:
                # A client streaming from the handshake lands just ahead of the ticks (sleep_until_handshake).
                await lease.sleep_until_handshake()
            if self.wire.resumable:
                keep = ParkedCall(self.report, self.wire)
                token = self.host.actor.resumes.issue(lease, self._taken_over, keep=keep)
                if token is not None:
                    self.wire.offer_resume(token, resumed=self._resumed)
            for message in self.wire.ready():
                await self._send_control(message)
            if self.wire.begins_at_once():
                lease.begin()
            self._enter(SessionState.LIVE)
            nursery.start_soon(self._guard, self._send_loop, lease)
            nursery.start_soon(self._watch_failure, lease)
            if self.settings.max_session_seconds:
                nursery.start_soon(self._time_limit, self.settings.max_session_seconds)

    async def _wait_until_live(self, lease: Lease) -> bool:
        """QUEUED, then PREPARING: keep the client informed until the lease is LIVE."""
        interval = self.settings.keepalive_interval
        with trio.move_on_after(self.settings.queue_timeout) as queue_timer:
            while lease.state is LeaseState.QUEUED and lease.failure is None:
                await self._keepalive(lease.position)
                with trio.move_on_after(interval):
                    await lease.wait_changed()
        if queue_timer.cancelled_caught:
            self.end(
                Outcome.QUEUE_TIMEOUT,
                f"no conversation slot became free within {self.settings.queue_timeout:g} s; try again later",
            )
            return False
        while lease.state in PREPARING_STATES and lease.failure is None:
            await self._keepalive(None)
            with trio.move_on_after(interval):
                await lease.wait_changed()
        if lease.failure is not None:
            self._end_from_failure(lease)
            return False
        return lease.state in BEGUN_STATES

    def _taken_over(self) -> None:
        """Another connection resumed this conversation with its token: this one lets go (pausing the lease for
        it) and is told so."""
        self.end(Outcome.TAKEN_OVER, "this conversation was resumed on another connection")

    async def _keepalive(self, position: int | None) -> None:
        if (message := self.wire.keepalive(position)) is not None:
            await self._send_control(message)

    async def _guard(self, fn: Any, *args: Any) -> None:
        """Run one pipeline task; turn its error into the session's ending (never the server's)."""
        try:
            await fn(*args)
        except ProtocolError as exc:
            self.host.metrics.errors.labels("protocol").inc()
            self.end(Outcome.PROTOCOL_ERROR, exc.message, code=exc.code)
        except Exception:
            logger.exception("session %d: internal error in %s", self.id, getattr(fn, "__name__", fn))
            self.host.metrics.errors.labels("session").inc()
            self.end(Outcome.INTERNAL_ERROR, "internal server error in this conversation; please reconnect")

    # -- the three tasks -----------------------------------------------------

    async def _receive_task(self, lease: Lease) -> None:
        if await self._receiver.receive(lease) is InputEnd.HANGUP:
            self.end(Outcome.HANGUP)  # nothing to flush: nobody is listening

    async def _process_task(self, lease: Lease) -> None:
        if (end := await self._receiver.process(lease)) is InputEnd.LEASE_FAILED:
            self._end_from_failure(lease)
        elif end is InputEnd.UNHEARD:  # (FLUSHED: the send task ends the session once all is out)
            self.end(Outcome.COMPLETED)  # the input ended before the conversation began

    async def _send_loop(self, lease: Lease) -> None:
        """Engine output → encoded messages → socket, each write with a deadline."""
        end = await self._sender.stream(lease)
        if end is StreamEnd.CLIENT_TIMEOUT:
            self.end(Outcome.CLIENT_TIMEOUT, "client did not read its messages in time")
        elif end is StreamEnd.COMPLETE:
            self.end(Outcome.COMPLETED)  # everything is out: a normal end
        # else: the lease ended, so the session is ending anyway

    async def _send_control(self, message: Message) -> None:
        """A message outside the audio stream (keepalive, ready), with the same deadline."""
        if not await self._sender.control(message):
            self.end(Outcome.CLIENT_TIMEOUT, "client did not read its messages in time")
            await trio.lowlevel.checkpoint()  # the session's scope is cancelled: stop here

    async def _watch_failure(self, lease: Lease) -> None:
        while lease.failure is None:
            await lease.wait_changed()
        self._end_from_failure(lease)

    async def _time_limit(self, seconds: float) -> None:
        """``--max-session-seconds``: one conversation cannot hold a slot for ever."""
        await trio.sleep(seconds)
        self.end(
            Outcome.TIME_LIMIT,
            f"this conversation reached the server's time limit of {seconds:g} s; start a new one to go on",
        )

    def _end_from_failure(self, lease: Lease) -> None:
        assert lease.failure is not None
        outcome = Outcome.ENGINE_ERROR if lease.failure.code == CloseCode.INTERNAL_ERROR else Outcome.REJECTED
        self.end(outcome, lease.failure.message, code=lease.failure.code)

    def describe(self) -> dict[str, Any]:
        """What ``/api/sessions`` and the status page show of it now: its step, slot, counters, quality and
        each side's latest words."""
        return {
            "id": self.id,
            "protocol": self.protocol,
            "state": self.status,
            **lease_figures(self.lease, self.host.actor.engine.sample_rate),
            **dataclasses.asdict(self.stats),
            "frames_sent": self._sender.frames_sent,
            "text_sent": self._sender.text_sent,
            "quality": self.report.quality.statistics().as_dict(),
            "words": self.report.latest_words(),
            **self.wire.call_details(),  # (a phone call: the carrier's call, stream and account ids)
        }
