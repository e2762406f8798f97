"""The HTTP/WebSocket transport: hypercorn's connection handling over sockets we guard.

hypercorn's trio worker writes to a socket with cancellation shielded, so a
client that stops reading would hold that write, and the task behind it,
forever: no deadline of ours could end it, and neither could shutdown.  So we
run hypercorn's connection class (``TCPServer``) on our own accept loop, over
a guarded stream (:class:`~pplex_trio.server.transport._guarded_stream.GuardedStream`) that

* ends every write by a deadline, and a connection that sends nothing for
  ``read_timeout`` (not even a pong to hypercorn's pings: a dead, frozen or
  half-open peer), by aborting it (a TCP reset); one watchdog checks them all,
  which costs less than hypercorn's own ``read_timeout``, a deadline per read;
* passes the client's bytes through the sans-IO :class:`~pplex_trio.protocol.InboundGuard`
  (request-head limit, no compression, message-size limit at the frame header);
* can be aborted from outside, which is how shutdown ends connections that
  would not close in time.

hypercorn pings every WebSocket (``websocket_ping_interval``), so a live
client always has something to send.

With TLS (``GuardedTLSStream``) the same guard reads the decrypted bytes,
and the deadlines and the abort act on the socket below; a plain-HTTP request
to the TLS port is answered with a redirect to ``https://``.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr, wrap_app

from ...protocol import Refusal
from ._guarded_stream import GuardedStream, GuardedTLSStream

logger = logging.getLogger(__name__)


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
