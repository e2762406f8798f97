"""Opening a client WebSocket whose TCP stream we own.

trio-websocket's ``open_websocket_url`` leaves its socket open when the
*server* closes first (it waits for the server's TCP close, then skips its
own ``aclose``), which leaks a file descriptor per conversation in a
long-running load generator.  Here we open the TCP stream ourselves, hand it
to ``wrap_client_stream`` (public API) and always close it.
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.parse
from collections.abc import AsyncIterator

import trio
from trio_websocket import WebSocketConnection, wrap_client_stream


@contextlib.asynccontextmanager
async def open_websocket(
    url: str, *, max_message_size: int = 16 * 1024 * 1024, message_queue_size: int = 64
) -> AsyncIterator[WebSocketConnection]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"WebSocket URL must start with ws:// or wss://, got {url!r}")
    secure = parts.scheme == "wss"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if secure else 80)
    resource = parts.path or "/"
    if parts.query:
        resource += "?" + parts.query
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    try:
        if secure:
            stream = trio.SSLStream(stream, ssl.create_default_context(), server_hostname=host)
        async with trio.open_nursery() as nursery:
            ws = await wrap_client_stream(
                nursery, stream, parts.netloc, resource,
                max_message_size=max_message_size, message_queue_size=message_queue_size,
            )
            try:
                yield ws
            finally:
                with trio.move_on_after(2) as cleanup:
                    cleanup.shield = True
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)
