"""Clients over the virtual network (``virtual_net.py``): HTTP through httpx, WebSockets through trio-websocket.

* :class:`VirtualTransport` is an httpx transport: a test keeps httpx's
  client (params, headers, cookies, JSON), and each request goes over a new
  virtual connection, spoken in HTTP/1.1 by h11.
* :func:`open_websocket` is ``pplex_trio.client.open_websocket`` over the
  virtual network: the same options (token, origin, TLS) and the same
  ``Refused`` when the upgrade is refused, on trio-websocket's
  ``wrap_client_stream``.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Iterable

import h11
import httpx
import trio
from trio_websocket import ConnectionRejected, WebSocketConnection, wrap_client_stream
from wsproto.utilities import LocalProtocolError

from _helpers.virtual_net import VirtualNetwork
from pplex_trio.client import Refused


def _port(parts: urllib.parse.SplitResult, secure: bool) -> int:
    return parts.port or (443 if secure else 80)


class VirtualTransport(httpx.AsyncBaseTransport):
    """httpx's requests over the virtual network, one connection each, from ``source``."""

    def __init__(
        self, network: VirtualNetwork, *, source: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None
    ):
        self.network = network
        self.source = source
        self.ssl_context = ssl_context

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {}).get("read")
        try:
            with trio.fail_after(timeout if timeout is not None else float("inf")):
                status, headers, body = await self._exchange(request)
        except trio.TooSlowError:
            raise httpx.ReadTimeout(f"no answer within {timeout} s", request=request) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError) as exc:
            raise httpx.ReadError(f"the connection failed: {exc!r}", request=request) from exc
        return httpx.Response(status, headers=headers, content=body, request=request)

    async def _exchange(self, request: httpx.Request) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        url = request.url
        secure = url.scheme == "https"
        stream: trio.abc.Stream = await self.network.connect(
            url.host, url.port or (443 if secure else 80), source=self.source
        )
        if secure:
            stream = trio.SSLStream(stream, self.ssl_context or ssl.create_default_context(), server_hostname=url.host)
        connection = h11.Connection(h11.CLIENT)
        try:
            body = await request.aread()
            data = connection.send(
                h11.Request(method=request.method, target=url.raw_path, headers=list(request.headers.raw))
            )
            if body:
                data += connection.send(h11.Data(data=body))
            data += connection.send(h11.EndOfMessage())
            await stream.send_all(data)
            status, headers, chunks = 0, [], []
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    connection.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status, headers = event.status_code, list(event.headers)
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return status, headers, b"".join(chunks)
        finally:
            await trio.aclose_forcefully(stream)


@contextlib.asynccontextmanager
async def open_websocket(
    network: VirtualNetwork,
    url: str,
    *,
    token: str | None = None,
    origin: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    subprotocols: Iterable[str] | None = None,
    max_message_size: int = 16 * 1024 * 1024,
    message_queue_size: int = 64,
    source: str = "127.0.0.1",
    receive_buffer: int | None = None,
    headers: Iterable[tuple[str, str]] = (),
) -> AsyncIterator[WebSocketConnection]:
    """A WebSocket to ``url`` (``ws://`` or ``wss://``) over ``network``; ``Refused`` if the upgrade is refused.
    ``receive_buffer``: the bytes the network holds towards this client (a small one fills fast); ``headers``:
    more headers for the upgrade."""
    parts = urllib.parse.urlsplit(url)
    secure = parts.scheme == "wss"
    host = parts.hostname or "127.0.0.1"
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    extra = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    headers = [(b"Authorization", f"Bearer {token}".encode("ascii"))] if token else []
    headers += extra
    if origin is not None:
        headers.append((b"Origin", origin.encode("ascii")))
    stream: trio.abc.Stream = await network.connect(
        host, _port(parts, secure), source=source, receive_buffer=receive_buffer
    )
    try:
        if secure:
            stream = trio.SSLStream(stream, ssl_context or ssl.create_default_context(), server_hostname=host)
            try:
                await stream.do_handshake()
            except trio.BrokenResourceError as exc:
                if isinstance(exc.__cause__, ssl.SSLError):
                    raise exc.__cause__ from None
                raise
        try:
            async with trio.open_nursery() as nursery:
                ws = await wrap_client_stream(
                    nursery,
                    stream,
                    parts.netloc,
                    resource,
                    subprotocols=subprotocols,
                    extra_headers=headers,
                    max_message_size=max_message_size,
                    message_queue_size=message_queue_size,
                )
                try:
                    yield ws
                finally:
                    with trio.move_on_after(2) as cleanup:
                        cleanup.shield = True
                        await ws.aclose()
                    nursery.cancel_scope.cancel()
        except* ConnectionRejected as rejected:
            first = rejected.exceptions[0]
            assert isinstance(first, ConnectionRejected)
            raise Refused(first.status_code, _refusal_message(first.body)) from None
        except* LocalProtocolError as errors:
            # trio-websocket answers a ping that crosses our close with a pong, which wsproto refuses to send
            # once closing (python-trio/trio-websocket#184): the close itself went through; that error alone
            # is no failure.  (On the virtual clock the server's first ping meets a quick close every time.)
            if not all(_pong_while_closing(error) for error in errors.exceptions):
                raise
    finally:
        await trio.aclose_forcefully(stream)


def _pong_while_closing(error: BaseException) -> bool:
    return isinstance(error, LocalProtocolError) and str(error).startswith("Event Pong(") and "CLOSING" in str(error)


def _refusal_message(body: bytes | None) -> str:
    try:
        return str(json.loads(body or b"")["error"])
    except (ValueError, KeyError, TypeError):
        return (body or b"").decode("utf-8", "replace")[:200] or "no reason given"
