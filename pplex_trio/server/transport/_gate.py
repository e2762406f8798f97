"""The door of the server: an ASGI middleware that applies the :class:`AccessPolicy`.

It sits between hypercorn and the Quart app, so a refused request never
reaches a route, and a refused WebSocket upgrade is answered with a plain HTTP
status (401, 403, 429) before it is accepted (ASGI's ``websocket.http.response``).

Two things here are for browsers:

* a page request (``GET`` for HTML) without the token gets a small form that
  asks for it, so our web UI, the official client and ``/metrics`` in a
  browser all ask the same way;
* a page opened with the right ``?token=`` gets the cookie and a redirect to the
  same address without the token, so the token does not stay in the address
  bar, the history or a ``Referer``.

And one thing is for load balancers: with ``busy`` given, a WebSocket upgrade
the server cannot take now (``busy(path)`` gives a reason) is answered 503
with ``Retry-After`` before it is accepted, which nginx's
``proxy_next_upstream http_503`` turns into a try at the next replica.
"""

from __future__ import annotations

import html
import json
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

import trio

from ...protocol import TOKEN_PARAMETER, AccessPolicy, Refused, RequestHead, query_without_token

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]

# Where the gate leaves the settings of a spent client secret, for the WebSocket's route (AsgiWebSocket.grant).
GRANT_KEY = "pplex_trio.grant"
# The pages a person opens in a browser (the cookie is handed out there).
PAGES = frozenset({"/", "/official/", "/status"})


class AccessGate:
    """``app`` behind ``policy``; ``on_refusal(reason)`` counts each refusal."""

    def __init__(
        self,
        app: Any,
        policy: AccessPolicy,
        *,
        on_refusal: Callable[[str], None] = lambda reason: None,
        busy: Callable[[str], Refused | None] | None = None,
        cross_origin: tuple[str, ...] = (),
    ):
        self.app = app
        self.cross_origin = cross_origin  # HTTP routes (prefixes) a page of an allowed origin may call (CORS)
        self.policy = policy
        self.on_refusal = on_refusal
        self.busy = busy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        websocket = scope["type"] == "websocket"
        client = scope.get("client")
        request = RequestHead(
            websocket=websocket,
            path=scope["path"],
            query=scope.get("query_string", b""),
            headers=scope.get("headers", ()),
            client=client[0] if client else None,
            method=scope.get("method", "GET"),
        )
        if not websocket and request.path.startswith(self.cross_origin):
            origin = request.header(b"origin")
            if origin is not None:  # a page's call: the origins' rule, as for WebSockets, and CORS for the allowed
                refused = self.policy.check_origin(request)
                if refused is not None:
                    await self._refuse(scope, send, request, refused)
                    return
                if request.method == "OPTIONS":  # (a preflight carries no token: it asks what the call may send)
                    await _preflight(send, origin)
                    return
                send = _allowing(send, origin)
        verdict = self.policy.check(request, now=trio.current_time())
        if isinstance(verdict, Refused):
            await self._refuse(scope, send, request, verdict)
            return
        if verdict.grant is not None:
            scope = {**scope, GRANT_KEY: verdict.grant}
        if not websocket:
            if verdict.via == "query" and scope.get("method") in ("GET", "HEAD") and request.path in PAGES:
                await self._hand_out_cookie(scope, send, request)
                return
            await self.app(scope, receive, send)
            return
        refused = self.policy.open(request.client)
        if refused is None and self.busy is not None and (busy := self.busy(request.path)) is not None:
            self.policy.close(request.client)
            refused = busy
        if refused is not None:
            await self._refuse(scope, send, request, refused)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.policy.close(request.client)

    async def _refuse(self, scope: Scope, send: Send, request: RequestHead, refused: Refused) -> None:
        # The path only: a query may hold a (wrong) token, which is never logged.
        what = "WebSocket" if request.websocket else scope.get("method", "?")
        logger.info(
            "refused %s %s from %s: %s (%d)", what, request.path, request.client, refused.reason, refused.status
        )
        self.on_refusal(refused.reason)
        headers = [(b"cache-control", b"no-store")]
        if refused.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="pplex-trio"'))
        if refused.status == 429:
            headers.append((b"retry-after", b"5"))
        if refused.status == 503:
            headers.append((b"retry-after", b"1"))
        if not request.websocket and _wants_page(scope, request):
            body = _token_form(request).encode()
            headers.append((b"content-type", b"text/html; charset=utf-8"))
            headers.append(
                (b"content-security-policy", b"default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
            )
        else:
            body = json.dumps({"error": refused.message}).encode()
            headers.append((b"content-type", b"application/json"))
        headers.append((b"content-length", str(len(body)).encode()))
        if request.websocket:
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1008})  # the server answers 403
                return
            await send({"type": "websocket.http.response.start", "status": refused.status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
            return
        await send({"type": "http.response.start", "status": refused.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})

    async def _hand_out_cookie(self, scope: Scope, send: Send, request: RequestHead) -> None:
        rest = query_without_token(request.query)
        location = request.path + (f"?{rest}" if rest else "")
        logger.info("gave the access cookie to %s", request.client)
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode("latin-1", "replace")),
                    (b"set-cookie", self.policy.set_cookie_header().encode()),
                    (b"cache-control", b"no-store"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"content-length", b"0"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})


CORS_HEADERS = [(b"access-control-allow-credentials", b"true"), (b"vary", b"Origin")]


async def _preflight(send: Send, origin: str) -> None:
    """The answer to a page's preflight for a call route: POST, with its token and its SDP or JSON."""
    headers = [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-methods", b"POST"),
        (b"access-control-allow-headers", b"authorization, content-type"),
        (b"access-control-max-age", b"600"),
        *CORS_HEADERS,
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def _allowing(send: Send, origin: str) -> Send:
    """``send``, with the answer readable by the page at ``origin`` (its ``Location`` included)."""

    async def allowed(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            extra = [
                (b"access-control-allow-origin", origin.encode("latin-1")),
                (b"access-control-expose-headers", b"Location"),
                *CORS_HEADERS,
            ]
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return allowed


def _wants_page(scope: Scope, request: RequestHead) -> bool:
    """A browser asking for a page (not a script's fetch of JSON)."""
    return scope.get("method") in ("GET", "HEAD") and "text/html" in (request.header(b"accept") or "")


def _token_form(request: RequestHead) -> str:
    """The page that asks for the token; the other query parameters ride along in the form."""
    pairs = urllib.parse.parse_qsl(request.query.decode("latin-1"), keep_blank_values=True)
    wrong = any(name == TOKEN_PARAMETER for name, _ in pairs)
    hidden = "".join(
        f'<input type="hidden" name="{html.escape(name)}" value="{html.escape(value)}">'
        for name, value in pairs
        if name != TOKEN_PARAMETER
    )
    note = '<p class="wrong" role="alert">That token is not the right one.</p>' if wrong else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>pplex-trio: access token</title>
<style>body{{font:16px system-ui,sans-serif;max-width:30em;margin:4em auto;padding:0 1em}}
input{{font:inherit;padding:.4em}}.wrong{{color:#b00020}}</style></head>
<body><h1>Access token</h1>
<p>This server needs its access token. Ask whoever runs it; the browser keeps it for this session.</p>
{note}<form method="get" action="{html.escape(request.path)}">{hidden}
<label>Token <input name="{TOKEN_PARAMETER}" type="password" autocomplete="current-password" required autofocus>
</label> <button type="submit">Continue</button></form></body></html>
"""
