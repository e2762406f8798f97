"""Reconnecting a dropped call and resuming it with its token (``pplex-trio client --reconnect-seconds``).

A call on a protocol whose server can resume it (raw; Moshi and Realtime
with ``resumable=1``) keeps the token the server gave last.  When its connection
drops mid-call (a reset, a TCP close without a WebSocket close, a server
silent for ``--timeout``), the client connects again after 0.25 s, then 0.5,
1, 2, 4, 4 … s, presenting that token, until the server's window has surely
lapsed (``seconds`` after the drop).  The input is real-time audio: the frames
that fell in the outage are never sent (a resumed connection goes on from
where real time now is), and the answer gets silence in their place, so every
time in it stays right.  A server that refuses the resume (its window lapsed,
the token is spent: 1008) ends the call as any refusal does.

A protocol adapts by writing one connection's part as a *leg*
(``leg(line, call)``): its handshake (a resumed one when ``call.resuming``),
then :meth:`ResumableCall.started` and the streaming from the frame it names,
noting each token in ``call.token``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._conversation import FRAME_SECONDS, FRAME_SIZE, SAMPLE_RATE
from ._call import Answer, CallFailed, CallLine, ClientResult, open_call

logger = logging.getLogger(__name__)

RECONNECT_SECONDS = 20.0  # the client's default: the server's --resume-seconds default
FIRST_DELAY = 0.25  # the first reconnect waits this long; each next one twice as long as the one before
MAX_DELAY = 4.0


class ResumableCall:
    """One call across its connections: the token that resumes it, the real-time pace of its input, and its
    outage while it is being resumed."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.token: str | None = None  # the server's latest (None: it offers no resume)
        self.connections = 0  # connections that got through their handshake
        self.dropped_at: float | None = None  # when the connection dropped (None: not in an outage)
        self.attempts = 0  # reconnects in this outage

    @property
    def resuming(self) -> bool:
        """This connection resumes the call (its handshake presents ``token``)."""
        return self.connections > 0

    def started(self) -> int:
        """The connection's handshake is over: the input frame to send next (after an outage, where real time is
        now; the answer is filled with silence up to there)."""
        answer = self.answer
        self.connections += 1
        if answer.since is None:
            answer.begin()
            return 0
        now = trio.current_time()
        index = math.ceil((now - answer.since) / FRAME_SECONDS)
        filled = answer.outage
        answer.fill_until(index * FRAME_SIZE)
        if self.dropped_at is not None:
            logger.info(
                "resumed the call after %.1f s (attempt %d); %.1f s of the answer is silence where it was lost",
                now - self.dropped_at,
                self.attempts,
                (answer.outage - filled) / SAMPLE_RATE,
            )
        self.dropped_at, self.attempts = None, 0
        return index

    def deadline(self, index: int) -> float:
        """When input frame ``index`` is due (real time from the first handshake)."""
        assert self.answer.since is not None
        return self.answer.since + index * FRAME_SECONDS


Leg = Callable[[CallLine, ResumableCall], Awaitable[None]]


async def resuming_call(
    leg: Leg,
    answer: Answer,
    url: Callable[[ResumableCall], str],
    idle: float,
    connect: dict[str, Any],
    seconds: float,
) -> ClientResult:
    """Run ``leg`` on a connection to ``url(call)``; when it drops mid-call and the server gave a token, reconnect
    with backoff for up to ``seconds`` (0: never) and run it again.  :class:`CallFailed` when the call ends
    abnormally and cannot be resumed."""
    call = ResumableCall(answer)
    first: CallFailed | None = None  # the drop that began the outage
    while True:
        if call.dropped_at is not None:
            call.attempts += 1
            await _back_off(call, first, seconds)
        try:
            async with open_call(url(call), answer, idle, connect) as line:
                await leg(line, call)
            return answer.complete()
        except CallFailed as failed:
            if not (failed.dropped and seconds > 0 and call.token is not None):
                raise
            if call.dropped_at is None:
                call.dropped_at, first = trio.current_time(), failed
            elif trio.current_time() - call.dropped_at >= seconds and first is not None:
                detail = "; ".join(d for d in (first.detail, f"not resumed within {seconds:g} s") if d)
                raise CallFailed(first.what, detail, first.seconds, answer.partial()) from None


async def _back_off(call: ResumableCall, first: CallFailed | None, seconds: float) -> None:
    """Wait before the next reconnect (0.25 s, doubling to 4 s, never past the outage's ``seconds``); one line."""
    assert call.dropped_at is not None
    delay = min(FIRST_DELAY * 2 ** (call.attempts - 1), MAX_DELAY)
    await trio.sleep_until(min(trio.current_time() + delay, call.dropped_at + seconds))
    if call.attempts == 1 and first is not None:
        seconds_in = f" {first.seconds:.1f} s into the call" if first.seconds is not None else ""
        why = f" ({first.detail})" if first.detail else ""
        logger.info("%s%s%s; reconnecting… (attempt 1)", first.what, seconds_in, why)
    else:
        logger.info("reconnecting… (attempt %d)", call.attempts)
