"""One call's connection, and what it has received: whatever ends it abnormally (a reset, a close with or
without a close frame, a refusal, a server that goes silent) comes out as one :class:`CallFailed` that holds
what had been received and says what happened."""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import trio
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection

from .._conversation import FRAME_SIZE, SAMPLE_RATE
from ._ws import Refused, open_websocket, transport_ending

IDLE_TIMEOUT = 30.0  # seconds the server may send nothing before the client gives up on the call
LOST = "the connection was lost"  # what a call is told when its connection ends with no word from the server


@dataclasses.dataclass
class ClientResult:
    """What a conversation sent back: the agent's audio (as long as the input), its text pieces and the close code."""

    pcm: np.ndarray  # agent audio, float32, same length as the input
    text: list[dict[str, Any]]  # [{"time": seconds, "text": piece}]
    close_code: int | None = None
    outage: float = 0.0  # seconds of silence in ``pcm`` where the connection was lost (the call resumed)


class ClientError(Exception):
    """The server refused or ended the conversation."""


class CallFailed(ClientError):
    """The call could not start, or ended before its answer was complete: ``what`` happened (``detail``: why),
    ``seconds`` after the streaming began (None: it never began), and ``result``, what had been received (its
    audio as long as what came, not padded).  :func:`run_client` sets ``wrote`` once it has written that.
    ``dropped``: the connection was lost (or went silent) with no word from the server, so resuming may help."""

    def __init__(
        self, what: str, detail: str | None, seconds: float | None, result: ClientResult, *, dropped: bool = False
    ):
        super().__init__(what)
        self.what = what
        self.detail = detail
        self.seconds = seconds
        self.result = result
        self.dropped = dropped
        self.wrote: str | None = None

    def __str__(self) -> str:
        line = self.what if self.seconds is None else f"{self.what} {self.seconds:.1f} s into the call"
        if self.detail:
            line += f" ({self.detail})"
        if self.seconds is not None:
            line += f": wrote {self.wrote}" if self.wrote else ": nothing written"
        return line


class Answer:
    """What the call has received so far: the agent's audio and its text pieces, timed by that audio."""

    def __init__(self, length: int):
        self.length = length  # the input's: a complete answer is as long
        self.chunks: list[np.ndarray] = []
        self.text: list[dict[str, Any]] = []
        self.samples = 0
        self.since: float | None = None  # when the streaming began (the handshake is over)
        self.ended: float | None = None  # when the call ended (or failed)
        self.outage = 0  # samples of silence filled in where the connection was lost

    def begin(self) -> None:
        """The handshake is over: the streaming (and the call's clock) begins now."""
        self.since = trio.current_time()

    def end(self) -> None:
        """The call ended (or failed) now."""
        self.ended = trio.current_time()

    def audio(self, samples: np.ndarray) -> None:
        """The agent's next samples."""
        self.chunks.append(samples)
        self.samples += samples.size

    def piece(self, text: str) -> None:
        """The agent's next text piece, stamped with the audio received so far."""
        self.text.append({"time": round(self.samples / SAMPLE_RATE, 3), "text": text})

    def fill_until(self, samples: int) -> None:
        """The call resumed after an outage: silence up to ``samples``, so what follows keeps its time."""
        missing = min(samples, self.length) - self.samples
        if missing > 0:
            self.audio(np.zeros(missing, np.float32))
            self.outage += missing

    def complete(self) -> ClientResult:
        """The answer of a call that ended well: its audio as long as the input."""
        return ClientResult(_fit(self.chunks, self.length), self.text, outage=self.outage / SAMPLE_RATE)

    def partial(self) -> ClientResult:
        """What came before the call failed: its audio as long as what came, not padded."""
        samples = min(self.samples, self.length)
        return ClientResult(_fit(self.chunks, samples), self.text, outage=self.outage / SAMPLE_RATE)


class CallLine:
    """The call's WebSocket; every message received puts the silence deadline off by ``idle`` seconds."""

    def __init__(self, ws: WebSocketConnection, silence: trio.CancelScope, idle: float):
        self.ws = ws
        self._silence = silence
        self._idle = idle

    async def get_message(self) -> str | bytes:
        """The next message; the server is heard, so the silence deadline moves."""
        message = await self.ws.get_message()
        self._silence.deadline = trio.current_time() + self._idle
        return message

    async def send_message(self, message: str | bytes) -> None:
        """Send ``message``."""
        await self.ws.send_message(message)


# What ends a call abnormally (anything else is a bug, and raised as it is).
_CALL_ERRORS = (
    ClientError,
    Refused,
    HandshakeError,
    ConnectionClosed,
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
)


@contextlib.asynccontextmanager
async def open_call(url: str, answer: Answer, idle: float, connect: dict[str, Any]) -> AsyncIterator[CallLine]:
    """The call's connection; whatever ends it abnormally comes out as one :class:`CallFailed`."""
    line: CallLine | None = None
    try:
        with trio.CancelScope() as silence:
            async with open_websocket(url, **connect) as ws:
                silence.deadline = trio.current_time() + idle
                line = CallLine(ws, silence, idle)
                try:
                    yield line
                finally:
                    answer.end()  # (before the WebSocket's close, which may wait)
    except* _CALL_ERRORS as group:
        what, detail = _explain_end(_leaves(group), answer, transport_ending(line.ws) if line else None)
        dropped = what == LOST and answer.since is not None
        raise CallFailed(what, detail, _seconds(answer), answer.partial(), dropped=dropped) from None
    if silence.cancelled_caught:
        what = f"the server sent nothing for {idle:g} s"
        raise CallFailed(what, None, _seconds(answer), answer.partial(), dropped=answer.since is not None)


def _seconds(answer: Answer) -> float | None:
    if answer.since is None:
        return None
    return (answer.ended if answer.ended is not None else trio.current_time()) - answer.since


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _explain_end(leaves: list[BaseException], answer: Answer, ending: str | None) -> tuple[str, str | None]:
    """What happened, and why, for the most telling of the errors that ended the call."""
    started = answer.since is not None
    for leaf in leaves:  # the server's own words first
        if isinstance(leaf, ClientError):
            return ("the server ended the call" if started else "the server refused the call"), str(leaf)
    for leaf in leaves:
        if isinstance(leaf, Refused):
            return str(leaf), None
    for leaf in leaves:
        close = leaf.reason if isinstance(leaf, ConnectionClosed) else None
        if close is not None and close.code != 1006:  # a close frame came: its code says
            code, reason = close.code, close.reason
            name = (close.name or "").lower().replace("_", " ")
            said = f"{code} {name}".strip() + (f": {reason}" if reason else "")
            return ("the server went away" if code == 1001 else "the server closed the connection"), said
    for leaf in leaves:
        if isinstance(leaf, ssl.SSLCertVerificationError):
            return (
                f"{leaf.verify_message or leaf}: the server's certificate is not trusted here; pass "
                "--cafile with its cert.pem, or --insecure for a self-signed one you trust"
            ), None
    for leaf in leaves:
        if isinstance(leaf, (trio.TooSlowError, HandshakeError)):
            return "the server did not complete the TLS or WebSocket handshake in time", None
    if ending is not None or any(isinstance(leaf, ConnectionClosed) for leaf in leaves):
        return LOST, ending or "closed without a WebSocket close"
    for leaf in leaves:
        if isinstance(leaf, OSError) and not started:
            return "could not connect to the server", str(leaf) or type(leaf).__name__
    return LOST, str(leaves[0]) or type(leaves[0]).__name__


def _fit(chunks: list[np.ndarray], length: int) -> np.ndarray:
    out = np.zeros(length, dtype=np.float32)
    if chunks:
        audio = np.concatenate(chunks)[:length]
        out[: audio.size] = audio
    return out


def with_query(url: str, params: dict[str, str], *, keep: bool = True) -> str:
    """``url`` with ``params`` added to its query (``keep=False``: instead of it)."""
    parts = urllib.parse.urlsplit(url)
    query = "&".join(q for q in (parts.query if keep else "", urllib.parse.urlencode(params)) if q)
    return urllib.parse.urlunsplit(parts._replace(query=query))


async def until_set(event: trio.Event, fn: Any) -> None:
    """Run ``fn`` until ``event`` is set (or it returns)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fn)
        await event.wait()
        nursery.cancel_scope.cancel()


def frames_of(pcm: np.ndarray) -> list[np.ndarray]:
    """``pcm`` in frames of ``FRAME_SIZE``, the last one padded with silence."""
    count = -(-pcm.size // FRAME_SIZE)
    padded = np.zeros(count * FRAME_SIZE, dtype=np.float32)
    padded[: pcm.size] = pcm
    return list(padded.reshape(count, FRAME_SIZE))
