"""A client's connection as a stream: write and read deadlines, the inbound guard, an abort (and the same over TLS).

:class:`GuardedStream` is everything that stands between one socket and
hypercorn's connection handling: each write is timed so that the watchdog can
end it (:meth:`GuardedStream.enforce_deadlines`), the client's bytes pass the
sans-IO :class:`~pplex_trio.protocol.InboundGuard` before hypercorn reads
them, and a refusal is answered and the connection aborted with a TCP reset.
:class:`GuardedTLSStream` puts TLS between the guard and the socket, and
redirects a plain-HTTP request to ``https://``.

It stands apart from the accept loop (``_transport.py``): one connection's
stream knows nothing of listeners, hypercorn's lifespan or shutdown, and the
one watchdog that ends its deadlines reaches it only through
:meth:`~GuardedStream.enforce_deadlines` and :meth:`~GuardedStream.abort`.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
import struct
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import trio

from ..._conversation import CLOSE_BUDGET
from ...protocol import InboundGuard, Refusal

logger = logging.getLogger(__name__)


class GuardedStream(trio.abc.HalfCloseableStream):
    """A client's socket stream with write deadlines, an inbound guard, and an abort."""

    def __init__(
        self,
        stream: trio.SocketStream,
        *,
        write_timeout: float,
        max_message_bytes: int,
        read_timeout: float = math.inf,
        on_refusal: Callable[[Refusal], None] | None = None,
    ):
        self._stream: trio.abc.Stream = stream  # what bytes are read from and written to
        self.socket = stream.socket  # hypercorn reads the peer's address from it
        self._write_timeout = write_timeout
        self._read_timeout = read_timeout
        self.received_at = trio.current_time()  # when the client last sent anything (at first: connected)
        self._guard = InboundGuard(max_message_bytes)
        self._lock = trio.Lock()  # our own refusals write beside hypercorn's writes
        self._on_refusal = on_refusal
        self.aborted = False
        self.write_started: float | None = None  # when the write in progress began
        self.write_timed_out = False

    def peer(self) -> str:
        """The client's address as ``host:port``, for logs; never raises (a closed socket reads "a client that is
        gone").
        """
        try:
            address = self.socket.getpeername()
        except OSError:
            return "a client that is gone"
        return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address or "a local client")

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """The client's next bytes that passed the inbound guard (``b""`` at EOF); a guard refusal is answered, the
        connection aborted and ``trio.BrokenResourceError`` raised.
        """
        while True:
            data = await self._stream.receive_some(max_bytes)
            if not data:
                return data
            self.received_at = trio.current_time()
            passed, refusal = self._guard.inbound(data)
            if refusal is not None:
                await self._refuse(refusal)
                raise trio.BrokenResourceError(refusal.reason)
            if passed:
                return passed  # else: only the start of a header so far, read on

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` under the watchdog's write deadline; a write it aborted raises ``trio.BrokenResourceError``
        saying that the client read nothing.
        """
        # hypercorn serializes its writes already; the lock only keeps our refusals apart from them,
        # so the common case takes it without a yield (and the deadline is the watchdog's, below).
        if self._lock.locked():
            await self._lock.acquire()
        else:
            self._lock.acquire_nowait()
        try:
            if not self._guard.websocket:  # only the answer to an upgrade matters to the guard
                self._guard.outbound(bytes(data[:16]))
            self.write_started = trio.current_time()
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if self.write_timed_out:
                raise trio.BrokenResourceError(f"the client read nothing for {self._write_timeout:g} s") from None
            raise
        finally:
            self.write_started = None
            self._lock.release()

    def enforce_deadlines(self, now: float) -> None:
        """Abort the connection if a write has waited on the client for longer than the write timeout, or
        the client has sent nothing for longer than the read timeout.

        One watchdog calls this for every connection (:func:`~pplex_trio.server.transport._transport._watch_deadlines`):
        cheaper than a cancel scope around each of the many small reads and writes.
        """
        if self.write_started is not None and now - self.write_started >= self._write_timeout:
            logger.info("connection from %s: nothing read for %g s, aborted", self.peer(), self._write_timeout)
            self.write_timed_out = True
            self.abort()
        elif now - self.received_at >= self._read_timeout:
            logger.info("connection from %s: nothing received for %g s, aborted", self.peer(), self._read_timeout)
            self.abort()

    async def wait_send_all_might_not_block(self) -> None:
        """As the stream below: wait until a send might not block."""
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        """Half-close the socket once any write in progress (ours or hypercorn's) is done."""
        # hypercorn closes outside its send lock: a close that comes while an answer is being written
        # (a client that stopped sending its body) waits for the write instead of colliding with it.
        async with self._lock:
            assert isinstance(self._stream, trio.abc.HalfCloseableStream)  # the socket (TLS has its own send_eof)
            await self._stream.send_eof()

    async def aclose(self) -> None:
        """Close the stream below (an abort has already closed the socket)."""
        await self._stream.aclose()

    def abort(self) -> None:
        """Drop the connection now with a TCP reset; tasks blocked on it wake with an error."""
        if self.aborted:
            return
        self.aborted = True
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.socket.close()

    async def _refuse(self, refusal: Refusal) -> None:
        logger.warning("connection from %s refused: %s", self.peer(), refusal.reason)
        if self._on_refusal is not None:
            self._on_refusal(refusal)
        if refusal.http_status is not None:
            message = (
                f"HTTP/1.1 {refusal.http_status} {HTTPStatus(refusal.http_status).phrase}\r\n"
                "connection: close\r\ncontent-length: 0\r\n\r\n"
            ).encode()
        else:
            assert refusal.close_code is not None
            reason = refusal.reason.encode()[:123]
            message = bytes([0x88, 2 + len(reason)]) + int(refusal.close_code).to_bytes(2, "big") + reason
        with trio.move_on_after(CLOSE_BUDGET):
            async with self._lock:
                await self._stream.send_all(message)
        self.abort()


class GuardedTLSStream(GuardedStream):
    """A :class:`GuardedStream` over TLS.

    hypercorn tells a TLS stream by ``do_handshake``, ``selected_alpn_protocol``
    and ``transport_stream``; it runs the handshake under its own deadline.
    """

    def __init__(self, stream: trio.SocketStream, context: ssl.SSLContext, **options: Any):
        super().__init__(stream, **options)
        self._first = _FirstBytes(stream)
        # https_compatible: no close_notify is written or waited for (closing never blocks on a peer).
        self._tls = trio.SSLStream(self._first, context, server_side=True, https_compatible=True)
        self._stream = self._tls

    @property
    def transport_stream(self) -> GuardedTLSStream:
        """This stream itself: hypercorn reads ``transport_stream.socket`` for the peer's address."""
        return self  # hypercorn reads ``transport_stream.socket``

    def selected_alpn_protocol(self) -> str | None:
        """The ALPN protocol the TLS handshake chose, if any."""
        return self._tls.selected_alpn_protocol()

    async def do_handshake(self) -> None:
        """Run the TLS handshake; a plain-HTTP request instead is answered with a redirect to ``https://`` and raises
        ``trio.BrokenResourceError``.
        """
        first = await self._first.peek()
        if first[:1] not in (b"", b"\x16"):  # not a TLS handshake record: someone typed http://
            await self._redirect_to_https(first)
            raise trio.BrokenResourceError("plain HTTP on the TLS port")
        await self._tls.do_handshake()

    async def send_eof(self) -> None:
        """Nothing: TLS has no half-close, and hypercorn closes the stream next."""
        pass  # TLS has no half-close; hypercorn closes the stream next

    async def _redirect_to_https(self, first: bytes) -> None:
        head = first.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        target = head[0].split(" ")[1] if len(head[0].split(" ")) == 3 else "/"
        host = next((line.split(":", 1)[1].strip() for line in head[1:] if line.lower().startswith("host:")), None)
        if host is None or not target.startswith("/"):
            message = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
        else:
            location = f"https://{host}{target}".encode("latin-1", "replace")
            message = (
                b"HTTP/1.1 301 Moved Permanently\r\nlocation: "
                + location
                + b"\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
            )
        logger.info("connection from %s: plain HTTP on the TLS port, redirected to https://", self.peer())
        with trio.move_on_after(CLOSE_BUDGET) as deadline:
            await self._first.send_all(message)
        if deadline.cancelled_caught:
            self.abort()  # else the connection closes normally, so the client reads the redirect


class _FirstBytes(trio.abc.Stream):
    """A socket stream whose first bytes can be looked at before TLS reads them."""

    def __init__(self, stream: trio.SocketStream):
        self._stream = stream
        self._peeked = b""

    async def peek(self) -> bytes:
        self._peeked = await self._stream.receive_some(16384)
        return self._peeked

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._peeked:
            data, self._peeked = self._peeked, b""
            return data
        return await self._stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()
