"""``--access-log``: one line per request and per WebSocket, with any token masked.

The outermost ASGI middleware, so refusals at the door are logged too.  The
query is logged with the value of every ``token=`` and ``resume=`` (a resume
token) parameter replaced by ``***``; headers are never logged (``Authorization`` and the cookie carry the
token).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import trio

logger = logging.getLogger("pplex_trio.access")

_TOKEN_VALUE = re.compile(rb"(^|&)((?:token|resume)=)[^&]*")  # the access token, a resume token


def masked_query(query: bytes) -> str:
    """``query`` with the values of ``token=`` and ``resume=`` replaced by ``***`` (as sent otherwise,
    percent-escapes and all)."""
    return _TOKEN_VALUE.sub(rb"\1\2***", query).decode("latin-1")


class AccessLog:
    """``app``, with a log line when each request or WebSocket ends."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def watched_send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind in ("http.response.start", "websocket.http.response.start"):
                status.append(message["status"])
            elif kind == "websocket.accept":
                status.append(101)
            elif kind == "websocket.close" and not status:
                status.append(403)  # closed before it was accepted: the server answers 403
            await send(message)

        started = trio.current_time()
        try:
            await self.app(scope, receive, watched_send)
        finally:
            client = scope.get("client")
            query = scope.get("query_string", b"")
            target = scope["path"] + (f"?{masked_query(query)}" if query else "")
            method = "WebSocket" if scope["type"] == "websocket" else scope.get("method", "?")
            logger.info(
                '%s "%s %s" %s %.3fs',
                client[0] if client else "-",
                method,
                target,
                status[0] if status else "-",
                trio.current_time() - started,
            )
