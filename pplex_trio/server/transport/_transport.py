"""The HTTP/WebSocket transport: hypercorn's connection handling over sockets we guard.

hypercorn's trio worker writes to a socket with cancellation shielded, so a
client that stops reading would hold that write, and the task behind it,
forever: no deadline of ours could end it, and neither could shutdown.  So we
run hypercorn's connection class (``TCPServer``) on our own accept loop, over
a :class:`GuardedStream` that

* ends every write by a deadline, and a connection that sends nothing for
  ``read_timeout`` (not even a pong to hypercorn's pings: a dead, frozen or
  half-open peer), by aborting it (a TCP reset); one watchdog checks them all,
  which costs less than hypercorn's own ``read_timeout``, a deadline per read;
* passes the client's bytes through the sans-IO :class:`InboundGuard`
  (request-head limit, no compression, message-size limit at the frame header);
* can be aborted from outside, which is how shutdown ends connections that
  would not close in time.

hypercorn pings every WebSocket (``websocket_ping_interval``), so a live
client always has something to send.

With TLS (:class:`GuardedTLSStream`) the same guard reads the decrypted bytes,
and the deadlines and the abort act on the socket below; a plain-HTTP request
to the TLS port is answered with a redirect to ``https://``.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from http import HTTPStatus
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr, wrap_app

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

        One watchdog calls this for every connection (:func:`_watch_deadlines`):
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


class _Connection(TCPServer):
    """hypercorn's connection, reading without its deadline per read.

    hypercorn wraps every read in ``fail_after(read_timeout or inf)``; our
    watchdog ends silent clients instead, so that scope never fires and costs
    ~5 µs a read (two or three reads a conversation's tick).
    """

    async def _read_data(self) -> None:
        while True:
            try:
                data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
        await self.protocol.handle(Closed())


class Connections:
    """The open connections, so that shutdown can abort the ones that would not close."""

    def __init__(self) -> None:
        self.open: set[GuardedStream] = set()

    def abort_all(self) -> int:
        """Abort every open connection now (a TCP reset); returns how many there were."""
        streams = list(self.open)
        for stream in streams:
            stream.abort()
        return len(streams)


async def serve_http(
    app: Any,
    config: Config,
    listeners: Sequence[trio.abc.Listener[trio.SocketStream]],
    *,
    write_timeout: float,
    read_timeout: float = math.inf,
    max_message_bytes: int,
    shutdown_trigger: Callable[[], Awaitable[None]],
    on_refusal: Callable[[Refusal], None] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on the connections ``listeners`` accept until ``shutdown_trigger`` returns.

    A listener is a ``trio.SocketListener``, or any listener whose streams
    behave as socket streams (the tests' in-memory network): the guard reads
    the peer's address from ``stream.socket`` and aborts the connection
    through it, and the listener's own ``socket`` says where it listens.
    With ``ssl_context``, every connection is TLS.

    A connection whose writes wait on its client for ``write_timeout``, or whose
    client sends nothing for ``read_timeout``, is aborted.

    Then: no new connections; open ones get ``config.graceful_timeout`` to end,
    after which they are cancelled and, if a write still holds one, aborted.
    """
    app = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(app, config, lifespan_state)
    context = WorkerContext(None)
    connections = Connections()

    async def handle(stream: trio.SocketStream) -> None:
        guard = GuardedStream if ssl_context is None else partial(GuardedTLSStream, context=ssl_context)
        guarded = guard(
            stream,
            write_timeout=write_timeout,
            read_timeout=read_timeout,
            max_message_bytes=max_message_bytes,
            on_refusal=on_refusal,
        )
        connections.open.add(guarded)
        try:
            # hypercorn annotates its stream as an SSLStream; it takes any stream and tells TLS by do_handshake
            await _Connection(app, config, context, ConnectionState(lifespan_state.copy()), guarded)  # type: ignore[arg-type]  # any stream, see above
        finally:
            connections.open.discard(guarded)
            await trio.aclose_forcefully(guarded)  # hypercorn leaves it open when a TLS handshake fails

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        scheme = "http" if ssl_context is None else "https"
        binds = [f"{scheme}://{_address(listener)}" for listener in listeners]
        for bind in binds:
            await config.log.info(f"Running on {bind} (CTRL + C to quit)")
        async with trio.open_nursery() as connection_nursery:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(
                    partial(trio.serve_listeners, handle, list(listeners), handler_nursery=connection_nursery)
                )
                shortest = min(write_timeout, read_timeout)
                lifespan_nursery.start_soon(_watch_deadlines, connections, shortest)
                task_status.started(binds)
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
            for listener in listeners:
                await listener.aclose()
            await context.terminated.set()
            connection_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
            lifespan_nursery.start_soon(_abort_after, config.graceful_timeout, connections)
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


def _address(listener: trio.abc.Listener[trio.SocketStream]) -> str:
    """Where ``listener`` listens, as ``host:port``: from its socket (not part of ``trio.abc.Listener``, but a
    ``trio.SocketListener`` has one, and so must any other listener served here)."""
    sock = getattr(listener, "socket")  # noqa: B009 (not in trio.abc.Listener: mypy would refuse the attribute)
    return repr_socket_addr(sock.family, sock.getsockname())


WATCH_INTERVAL = 0.25  # s: a connection is aborted within this much of its deadline


async def _watch_deadlines(connections: Connections, shortest_timeout: float) -> None:
    """Every connection's read and write deadlines, checked by one task."""
    interval = min(WATCH_INTERVAL, shortest_timeout / 4)
    while True:
        await trio.sleep(interval)
        now = trio.current_time()
        for stream in list(connections.open):
            stream.enforce_deadlines(now)


async def _abort_after(seconds: float, connections: Connections) -> None:
    """At the end of the grace, abort what a shielded write still holds (cancellation cannot reach it)."""
    await trio.sleep(seconds + 0.05)
    aborted = connections.abort_all()
    if aborted:
        logger.warning("shutdown: aborted %d connection(s) that did not close in time", aborted)
