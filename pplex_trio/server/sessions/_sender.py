"""Writing to a client, every write with a deadline: a session's send task, its control messages, its close.

A client that stops reading blocks our writes once its buffers are full, so
each write waits at most ``--client-timeout``; missing it is reported, and
the session then ends (1008).  The send task also measures the latency each
frame added, and in one frame of :data:`STAGE_SAMPLING` where it went.  It
encodes as well: a frame goes out as soon as it is encoded, and a client that
reads slowly makes the lease's outbox drop raw frames before any are encoded,
so an Opus stream stays whole.  The
close, telling the client why, takes at most ``CLOSE_BUDGET`` in all.
"""

from __future__ import annotations

import enum
import math

import trio

from ..._conversation import CLOSE_BUDGET, CloseCode, Outcome
from ..._metrics import Metrics
from ...engine import Lease, OutputFrame
from ._wire import Message, WebSocket, WireProtocol

STAGE_SAMPLING = 4  # one frame in this many feeds the per-stage latency histograms


class StreamEnd(enum.Enum):
    """Why :meth:`Sender.stream` returned (the session makes the outcome of it)."""

    COMPLETE = enum.auto()  # a flushed conversation's output is all out
    CLIENT_TIMEOUT = enum.auto()  # a write waited longer than the deadline
    LEASE_ENDED = enum.auto()  # the conversation ended first


class Sender:
    """One session's writes: ``stream`` runs the send task, ``control`` sends one message beside it."""

    def __init__(self, ws: WebSocket, wire: WireProtocol, metrics: Metrics, *, timeout: float):
        self.ws = ws
        self.wire = wire
        self.metrics = metrics
        self.timeout = timeout
        self.frames_sent = 0  # output audio frames
        self.text_sent = 0

    async def control(self, message: Message) -> bool:
        """A message outside the audio stream (keepalive, ready, a reply); False: not written in time."""
        with trio.move_on_after(self.timeout) as timer:
            await self.ws.send(message)
        return not timer.cancelled_caught

    async def stream(self, lease: Lease) -> StreamEnd:
        """Engine output → encoded messages → socket, until the output ends or a write misses its deadline."""
        metrics = self.metrics
        stage = {name: metrics.latency_stage.labels(name) for name in ("wait_for_tick", "tick", "encode", "send")}
        observed = 0
        complete = False
        # One cancel scope for the whole loop, its deadline set per batch (a
        # frame's one or two messages): a new scope per message costs more than the send itself.
        with self.wire.output_stream(), trio.CancelScope() as timer:
            async for batch in lease.frames():
                frames = [event for event in batch if isinstance(event, OutputFrame)]
                complete = len(frames) < len(batch)  # an OutputEnd: the flush is done
                messages = await self.wire.encode(frames) if frames else []
                encoded = trio.current_time()
                self.text_sent += sum(1 for frame in frames if frame.text)
                if complete and (last := self.wire.end_of_output()) is not None:
                    messages.append((last, None))
                timer.deadline = encoded + self.timeout
                for message, frame in messages:
                    await self.ws.send(message)
                    if frame is None:
                        continue
                    self.frames_sent += 1
                    if frame.input_arrival is None:
                        continue
                    sent = trio.current_time()
                    metrics.added_latency.observe(sent - frame.input_arrival - frame.step_seconds)
                    observed += 1
                    if observed % STAGE_SAMPLING == 0:  # the split by stage needs fewer samples
                        stage["wait_for_tick"].observe(frame.tick_started - frame.input_arrival)
                        stage["tick"].observe(frame.delivered - frame.tick_started - frame.step_seconds)
                        stage["encode"].observe(encoded - frame.delivered)
                        stage["send"].observe(sent - encoded)
                timer.deadline = math.inf
                if complete:
                    break
        if timer.cancelled_caught:
            return StreamEnd.CLIENT_TIMEOUT
        return StreamEnd.COMPLETE if complete else StreamEnd.LEASE_ENDED

    async def close(self, code: CloseCode, message: str | None, outcome: Outcome) -> None:
        """CLOSING: tell the client why, close, and read until it answers the close."""
        # The client may be gone or stuck: never wait long on it.
        with trio.move_on_after(CLOSE_BUDGET):
            for last in self.wire.closing(message, code, outcome):
                await self.ws.send(last)
            await self.ws.close(code, close_reason(message))
            # Read on until the client answers the close (its disconnect then
            # cancels us, as Quart would): a socket closed with the client's
            # audio still unread would be reset, and the client might never
            # see why it ended.
            while True:
                await self.ws.receive()


def close_reason(message: str | None) -> str:
    """A close frame's reason must fit in 123 bytes of UTF-8."""
    data = (message or "").encode("utf-8")[:123]
    return data.decode("utf-8", errors="ignore")
