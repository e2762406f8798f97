"""Opening a client WebSocket whose TCP stream we own.

trio-websocket's ``open_websocket_url`` leaves its socket open when the
*server* closes first (it waits for the server's TCP close, then skips its
own ``aclose``), which leaks a file descriptor per conversation in a
long-running load generator.  Here we open the TCP stream ourselves, hand it
to ``wrap_client_stream`` (public API) and always close it.

``wss://`` verifies the server's certificate against the system's authorities,
or ``--cafile`` (a self-signed ``cert.pem``), or not at all with ``--insecure``.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import ssl
import typing
import urllib.parse
import weakref
from collections.abc import AsyncIterator

import trio
from trio_websocket import ConnectionRejected, WebSocketConnection, wrap_client_stream


class Refused(Exception):
    """The server refused the WebSocket upgrade (401, 403, 429, …); the message says why."""

    def __init__(self, status: int, message: str):
        super().__init__(f"the server refused the connection ({status}): {message}")
        self.status = status


class WatchedStream(trio.abc.Stream):
    """A stream that notes how the connection under the WebSocket ended (``ending``): trio-websocket reports a
    reset and a TCP close without a close frame alike (1006), and the user is told which it was."""

    def __init__(self, inner: trio.abc.Stream):
        self.inner = inner
        self.ending: str | None = None

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """The inner stream's, noting a broken connection."""
        try:
            await self.inner.send_all(data)
        except trio.BrokenResourceError as exc:
            self._note(exc)
            raise

    async def wait_send_all_might_not_block(self) -> None:
        """The inner stream's."""
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """The inner stream's, noting a broken connection or the peer's close."""
        try:
            data = await self.inner.receive_some(max_bytes)
        except trio.BrokenResourceError as exc:
            self._note(exc)
            raise
        if not data and self.ending is None:
            self.ending = "the server closed the TCP connection without a WebSocket close"
        return data

    async def aclose(self) -> None:
        """Close the inner stream."""
        await self.inner.aclose()

    def _note(self, exc: BaseException) -> None:
        if self.ending is not None:
            return
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if isinstance(cause, ConnectionResetError):
            self.ending = "reset by the peer"
        elif isinstance(cause, BrokenPipeError):
            self.ending = "the server closed the TCP connection (broken pipe)"
        else:
            self.ending = f"the connection broke ({cause or exc})"


def transport_ending(ws: WebSocketConnection) -> str | None:
    """How the connection under ``ws`` (opened by :func:`open_websocket`) ended, if it did: a reset, a close."""
    watched = _WATCHED.get(ws)
    return watched.ending if watched is not None else None


_WATCHED: weakref.WeakKeyDictionary[WebSocketConnection, WatchedStream] = weakref.WeakKeyDictionary()


def client_ssl_context(*, insecure: bool = False, cafile: str | pathlib.Path | None = None) -> ssl.SSLContext:
    """How ``wss://`` checks the server: the system's authorities, ``cafile``, or (``insecure``) not at all."""
    context = ssl.create_default_context(cafile=str(cafile) if cafile is not None else None)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


@contextlib.asynccontextmanager
async def open_websocket(
    url: str,
    *,
    max_message_size: int = 16 * 1024 * 1024,
    message_queue_size: int = 64,
    ssl_context: ssl.SSLContext | None = None,
    token: str | None = None,
    connect_timeout: float = 30.0,
    origin: str | None = None,
) -> AsyncIterator[WebSocketConnection]:
    """Open a WebSocket to a ``ws://`` or ``wss://`` URL (``ValueError`` for another scheme), optionally with a Bearer
    ``token`` and an ``Origin``; TLS errors surface as ``ssl.SSLError``, and ``connect_timeout`` bounds the TLS and
    WebSocket handshakes.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"WebSocket URL must start with ws:// or wss://, got {url!r}")
    secure = parts.scheme == "wss"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if secure else 80)
    resource = parts.path or "/"
    if parts.query:
        resource += "?" + parts.query
    headers = [(b"Authorization", f"Bearer {token}".encode("ascii"))] if token else []  # as h11 would encode it
    if origin is not None:  # as a web page at ``origin`` would connect (see docs/PROTOCOL.md on keepalives)
        headers.append((b"Origin", origin.encode("ascii")))
    tcp = await trio.open_tcp_stream(host, port)
    stream: trio.SocketStream | trio.SSLStream[trio.SocketStream] = tcp
    try:
        if secure:
            tls = trio.SSLStream(tcp, ssl_context or client_ssl_context(), server_hostname=host)
            try:
                with trio.fail_after(connect_timeout):
                    # Here, not in trio-websocket's reader task, which would swallow a certificate error and hang.
                    await tls.do_handshake()
            except trio.BrokenResourceError as exc:
                if isinstance(exc.__cause__, ssl.SSLError):
                    raise exc.__cause__ from None  # "certificate verify failed" says more than "broken"
                raise
            stream = tls
        watched = WatchedStream(stream)
        try:
            async with trio.open_nursery() as nursery:
                with trio.fail_after(connect_timeout):
                    ws = await wrap_client_stream(
                        nursery,
                        typing.cast(typing.Any, watched),  # (any trio Stream serves; its annotation names two)
                        parts.netloc,
                        resource,
                        extra_headers=headers,
                        max_message_size=max_message_size,
                        message_queue_size=message_queue_size,
                    )
                _WATCHED[ws] = watched
                try:
                    yield ws
                finally:
                    with trio.move_on_after(2) as cleanup:
                        cleanup.shield = True
                        await ws.aclose()
                    nursery.cancel_scope.cancel()
        except* ConnectionRejected as rejected:  # raised by the connection's reader task
            first = rejected.exceptions[0]
            assert isinstance(first, ConnectionRejected)
            raise Refused(first.status_code, _refusal_message(first.body)) from None
    finally:
        await trio.aclose_forcefully(stream)


def _refusal_message(body: bytes | None) -> str:
    try:
        return str(json.loads(body or b"")["error"])
    except (ValueError, KeyError, TypeError):
        return (body or b"").decode("utf-8", "replace")[:200] or "no reason given"
