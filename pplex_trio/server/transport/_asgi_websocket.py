"""The conversation routes' WebSockets, served straight on ASGI, below Quart's per-message wrapper.

Quart-Trio passes every incoming message through a task of its own and a
second channel, and fires two signals per message in and out; a conversation
is 25 messages a second in and 16 out, and at 64 conversations that wrapper
was several per cent of the event loop (``docs/BENCHMARKS.md``).  A session
needs only accept, receive, send and close, so the three conversation routes
get them from ASGI directly; every other route (pages, JSON, WebSockets of
any other path) stays with the Quart app.

The semantics are Quart's: a client that disconnects cancels the handler; a
handler that returns without closing closes with 1000, and one that never
accepted is answered 403 by hypercorn.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from werkzeug.datastructures import Headers

from ..._conversation import CLOSE_BUDGET
from ...protocol import SessionConfig
from ._gate import GRANT_KEY

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class AsgiWebSocket:
    """One WebSocket of the ASGI server, with the calls a session makes (see ``_wire.WebSocket``)."""

    def __init__(self, scope: Scope, receive: Receive, send: Send):
        self.scheme: str = scope.get("scheme", "ws")  # wss behind TLS
        self.path: str = scope["path"]
        self.query_string: bytes = scope.get("query_string", b"")
        self.raw_headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
        self._http_response = "websocket.http.response" in scope.get("extensions", {})
        self.headers = Headers(
            [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope.get("headers", ())]
        )
        self.requested_subprotocols: list[str] = list(scope.get("subprotocols", ()))
        self.grant: SessionConfig | None = scope.get(GRANT_KEY)  # a spent client secret's settings (the gate's)
        client = scope.get("client")
        self.client: str | None = client[0] if client else None  # the peer's address
        self._receive = receive
        self._send = send
        self.accepted = False
        self.closed = False
        self.disconnected = trio.CancelScope()  # cancelled when the client is gone

    async def accept(self, subprotocol: str | None = None) -> None:
        """Accept the upgrade, offering ``subprotocol``; a second call does nothing."""
        if not self.accepted:
            await self._send({"type": "websocket.accept", "subprotocol": subprotocol, "headers": []})
            self.accepted = True

    async def refuse(self, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
        """Answer the upgrade with an HTTP error instead of accepting it (a server without ASGI's
        ``websocket.http.response`` answers 403)."""
        self.closed = True
        if not self._http_response:
            await self._send({"type": "websocket.close", "code": 1008})
            return
        await self._send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await self._send({"type": "websocket.http.response.body", "body": body, "more_body": False})

    async def receive(self) -> bytes | str:
        """The client's next message (bytes or text); once the client has disconnected, cancels the handler's scope
        (:attr:`disconnected`) instead of returning.
        """
        while True:
            event = await self._receive()
            kind = event["type"]
            if kind == "websocket.receive":
                data = event.get("bytes")
                return data if data is not None else event["text"]
            if kind == "websocket.disconnect":
                break
            # else websocket.connect, which comes first: the upgrade itself, nothing to read
        # Nothing more will come, and nothing sent would arrive: unwind the handler.
        self.disconnected.cancel()
        await trio.lowlevel.checkpoint()  # raises Cancelled
        raise AssertionError("unreachable: the handler's scope is cancelled")

    async def send(self, data: bytes | str) -> None:
        """Send one message: text for ``str``, binary for ``bytes``."""
        if isinstance(data, str):
            await self._send({"type": "websocket.send", "bytes": None, "text": data})
        else:
            await self._send({"type": "websocket.send", "bytes": data, "text": None})

    async def close(self, code: int, reason: str = "") -> None:
        """Send the close frame with ``code`` and ``reason``; a second call, or one after :meth:`refuse`, does
        nothing."""
        if self.closed:
            return
        self.closed = True
        await self._send({"type": "websocket.close", "code": code, "reason": reason})


Handler = Callable[[AsgiWebSocket], Awaitable[None]]


class ConversationRouter:
    """ASGI: WebSocket upgrades to ``routes`` go to their handlers, POSTs to ``uploads`` to theirs (plain ASGI
    apps that read the body under their own limits); everything else to ``app``."""

    def __init__(self, app: Any, routes: Mapping[str, Handler], uploads: Mapping[str, Any] | None = None):
        self.app = app
        self.routes = dict(routes)
        self.uploads = dict(uploads or {})

    @property
    def websocket_paths(self) -> frozenset[str]:
        """The paths whose WebSocket upgrades this router serves itself."""
        return frozenset(self.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and scope["path"] in self.uploads:
            await self.uploads[scope["path"]](scope, receive, send)
            return
        handler = self.routes.get(scope["path"]) if scope["type"] == "websocket" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        ws = AsgiWebSocket(scope, receive, send)
        with ws.disconnected:
            await handler(ws)
        if ws.disconnected.cancelled_caught or ws.closed:
            return
        with trio.move_on_after(CLOSE_BUDGET):  # a handler that returned without closing: close, as Quart would
            await send({"type": "websocket.close", "code": 1000})
