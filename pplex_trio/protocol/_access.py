"""Who may use the server: the token, the Origin check, connections per address. Sans-IO.

A request is described by its head (:class:`RequestHead`); :meth:`AccessPolicy.check`
answers :class:`Allowed` or :class:`Refused` with the HTTP status and a message
that tells the client what to do.  Nothing here reads a socket or knows a web
framework: ``server/transport/_gate.py`` is the thin ASGI adapter around it.

The checks, in order:

1. **Origin** (WebSocket upgrades only).  A browser sends the page's origin with
   every upgrade, and any page may open a WebSocket to any address: without this
   check, a web page the user visits could talk to the server through their
   browser.  An ``Origin`` that is neither the server's own (its host equals the
   ``Host`` header) nor allowed is refused with 403.  Programs send no ``Origin``
   and are let in.
2. **The token**, when one is set: an ``Authorization: Bearer`` header, a
   ``token=`` query parameter (for clients that cannot send headers), the
   cookie that a page opened with ``?token=`` received, or (browser Realtime
   clients) an ``openai-insecure-api-key.<token>`` WebSocket subprotocol.  Compared in constant
   time; never echoed back.
   A WebSocket upgrade to one of ``in_session_paths`` is let through without
   it: that protocol carries the token in its own opening, where its session
   checks it before it takes a slot (a phone carrier's media stream, whose URL
   cannot carry a query: ``docs/TELEPHONY.md``).
   A client secret (``ek_...``, ``_client_secrets.py``) given the same ways opens a
   Realtime call (``secret_paths``: the WebSocket, the WebRTC offer) once, with or without a server token;
   it is spent by this check, and the connection starts with its settings
   (:attr:`Allowed.grant`).  On any other route it is refused with 401.
3. **Connections per address** (WebSocket upgrades only): the next upgrade from
   an address at its limit is refused with 429 until one of its connections ends.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from ._client_secrets import PREFIX as SECRET_PREFIX
from ._client_secrets import ClientSecrets
from ._realtime import SessionConfig

AUTH_TOKEN_ENV = "PPLEX_TRIO_AUTH_TOKEN"  # where the server and the client read the token (ps shows flags)
COOKIE_NAME = "pplex_trio_auth"
TOKEN_PARAMETER = "token"
REALTIME_KEY_SUBPROTOCOL = "openai-insecure-api-key"
ANY_ORIGIN = "*"


@dataclasses.dataclass(frozen=True)
class RequestHead:
    """What the checks need of a request (an ASGI scope carries all of it)."""

    websocket: bool
    path: str
    query: bytes = b""
    headers: Sequence[tuple[bytes, bytes]] = ()
    client: str | None = None  # the peer's address
    method: str = "GET"  # the HTTP method (a WebSocket's upgrade is a GET)

    def header(self, name: bytes) -> str | None:
        """The first header called ``name`` (lower case), decoded as Latin-1 like HTTP/1.1."""
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1")
        return None


@dataclasses.dataclass(frozen=True)
class Allowed:
    """The connection may go on; ``via`` says how its token was given (``session``: to be checked in the session's first
    event), or None when no token is required.
    """

    via: str | None  # "header", "query", "cookie", "subprotocol", "session" (to be checked there), or None: no
    # token is needed
    grant: SessionConfig | None = None  # a client secret was spent: the call starts with its settings


@dataclasses.dataclass(frozen=True)
class Refused:
    """The connection is refused before it opens: the HTTP status, the metrics label and the client's message."""

    status: int  # 401, 403, 429 (or 503 from the server's busy check)
    reason: str  # metrics label: unauthorized, forbidden_origin, too_many_connections
    message: str  # for the client; never contains the token


def parse_origins(text: str) -> frozenset[str]:
    """``--allowed-origins``: comma-separated origins (``https://app.example.com``), or ``*`` for any."""
    origins = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item == ANY_ORIGIN:
            origins.add(ANY_ORIGIN)
            continue
        normal = normalize_origin(item)
        if normal is None:
            raise ValueError(
                f"--allowed-origins: {item!r} is not an origin; write it as a browser sends it, "
                "like https://app.example.com or http://localhost:3000 (no path), or * for any"
            )
        origins.add(normal)
    return frozenset(origins)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` in lower case, the default port left out; None if it is not one."""
    if origin == "null":
        return "null"  # what sandboxed frames and file:// pages send
    try:
        parts = urllib.parse.urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if (
        parts.scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username
        or parts.password
    ):
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS[parts.scheme]:
        return f"{parts.scheme}://{host}"
    return f"{parts.scheme}://{host}:{port}"


def _with_port(host: str, scheme: str) -> str:
    """``host[:port]`` with the scheme's default port written out, in lower case (IPv6 in brackets)."""
    host = host.strip().lower()
    if host.endswith("]") or ":" not in host.rsplit("]", 1)[-1]:
        host = f"{host}:{_DEFAULT_PORTS[scheme]}"
    return host


def cookie_value(token: str) -> str:
    """What the cookie carries: derived from the token (safe in a cookie, useless as a bearer token)."""
    return hmac.new(token.encode(), b"pplex-trio browser cookie", hashlib.sha256).hexdigest()


def same_secret(candidate: str, expected: str) -> bool:
    """Whether ``candidate`` is the secret ``expected``, compared in constant time."""
    return hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), expected.encode())


def _cookies(header: str | None) -> Iterable[tuple[str, str]]:
    for item in (header or "").split(";"):
        name, sep, value = item.strip().partition("=")
        if sep:
            yield name.strip(), value.strip().strip('"')


def _presented(request: RequestHead) -> Iterator[tuple[str, str]]:
    """The keys ``request`` gives, and how: a Bearer header, ``token=`` queries, the Realtime key subprotocol."""
    authorization = request.header(b"authorization")
    if authorization is not None:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer":
            yield "header", value.strip()
    for name, value in urllib.parse.parse_qsl(request.query.decode("latin-1"), keep_blank_values=True):
        if name == TOKEN_PARAMETER:
            yield "query", value
    for offered in (request.header(b"sec-websocket-protocol") or "").split(","):
        # How a browser's OpenAI Realtime client carries its key: a WebSocket subprotocol.
        name, _, value = offered.strip().partition(".")
        if name == REALTIME_KEY_SUBPROTOCOL:
            yield "subprotocol", value


def query_without_token(query: bytes) -> str:
    """The query string with every ``token=`` parameter taken out (for the redirect after the cookie)."""
    pairs = urllib.parse.parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return urllib.parse.urlencode([(k, v) for k, v in pairs if k != TOKEN_PARAMETER])


class AccessPolicy:
    """The rules of one server, and the count of open WebSocket connections per address."""

    def __init__(
        self,
        *,
        token: str | None = None,
        allowed_origins: frozenset[str] = frozenset(),
        max_connections_per_address: int = 0,
        open_paths: frozenset[str] = frozenset(),
        in_session_paths: frozenset[str] = frozenset(),
        secure: bool = False,
        client_secrets: ClientSecrets | None = None,
        secret_paths: frozenset[str] = frozenset(),
        secret_posts: frozenset[str] = frozenset(),
    ):
        self.token = token or None
        self.allowed_origins = allowed_origins
        self.max_connections_per_address = max_connections_per_address
        self.open_paths = open_paths  # never need the token (health checks)
        self.in_session_paths = in_session_paths  # their WebSockets give the token in their opening
        self.secure = secure  # TLS: the cookie is marked Secure
        self.client_secrets = client_secrets  # the minted client secrets (None: none are taken)
        self.secret_paths = secret_paths  # the WebSockets a client secret opens a call on (once)
        self.secret_posts = secret_posts  # and the routes it opens one with a POST (a WebRTC offer)
        self._cookie = cookie_value(self.token) if self.token else None
        self._connections: Counter[str] = Counter()

    # -- the checks -------------------------------------------------------------

    def check(self, request: RequestHead, *, now: float) -> Allowed | Refused:
        """Whether ``request`` may go on (a WebSocket that may is not counted yet: see :meth:`open`); a client secret
        it gives is spent, on the clock of :attr:`client_secrets` (``now``)."""
        if request.websocket:
            refused = self.check_origin(request)
            if refused is not None:
                return refused
        secret = self._client_secret(request)
        if secret is not None and (self.token is not None or self._opens_call(request)):
            return self._spend(request, *secret, now=now)
        if self.token is None or request.path in self.open_paths:
            return Allowed(None)
        via = self._credential(request)
        if via is None and request.websocket and request.path in self.in_session_paths:
            return Allowed("session")  # checked by the session, before it takes a slot
        if via is None:
            return Refused(
                401,
                "unauthorized",
                "this server needs its access token: send 'Authorization: Bearer <token>', add "
                "'token=<token>' to the query, or open the page once with ?token=<token>",
            )
        return Allowed(via)

    def check_origin(self, request: RequestHead) -> Refused | None:
        """A page's request from an origin that is neither the server's own nor in ``allowed_origins`` (403);
        None for one that is (or that names no origin: not a page's)."""
        origin = request.header(b"origin")
        if origin is None or ANY_ORIGIN in self.allowed_origins:
            return None
        normal = normalize_origin(origin)
        if normal is not None and normal in self.allowed_origins:
            return None
        host = request.header(b"host")
        if normal is not None and normal != "null" and host is not None:
            scheme, _, origin_host = normal.partition("://")
            if _with_port(origin_host, scheme) == _with_port(host, scheme):
                return None  # the server's own pages
        return Refused(
            403,
            "forbidden_origin",
            f"{'WebSocket connections' if request.websocket else 'Calls'} from pages at {origin[:200]!r} are not "
            "allowed; the server's "
            "operator can allow that origin with --allowed-origins",
        )

    def _client_secret(self, request: RequestHead) -> tuple[str, str] | None:
        """How and which client secret ``request`` gives, if any (the server's token is never one)."""
        if self.client_secrets is None:
            return None
        for via, value in _presented(request):
            if value.startswith(SECRET_PREFIX) and not (self.token is not None and same_secret(value, self.token)):
                return via, value
        return None

    def _spend(self, request: RequestHead, via: str, value: str, *, now: float) -> Allowed | Refused:
        assert self.client_secrets is not None
        if not self._opens_call(request):
            return Refused(
                401,
                "unauthorized",
                "a client secret (ek_...) opens one Realtime call (a /v1/realtime WebSocket or a POST to "
                "/v1/realtime/calls) only; this route needs the server's access token",
            )
        spent = self.client_secrets.spend(value, now=now)
        if isinstance(spent, str):
            return Refused(401, "unauthorized", spent)
        return Allowed(via, grant=spent)

    def _opens_call(self, request: RequestHead) -> bool:
        """Whether ``request`` is one a client secret may open a call with."""
        if request.websocket:
            return request.path in self.secret_paths
        return request.method == "POST" and request.path in self.secret_posts

    def _credential(self, request: RequestHead) -> str | None:
        """How ``request`` carries the right token: "header", "query", "cookie", or None."""
        assert self.token is not None and self._cookie is not None
        for via, value in _presented(request):
            if same_secret(value, self.token):
                return via
        for name, value in _cookies(request.header(b"cookie")):
            if name == COOKIE_NAME and same_secret(value, self._cookie):
                return "cookie"
        return None

    def set_cookie_header(self) -> str:
        """The ``Set-Cookie`` that lets a browser in from now on (a session cookie, script cannot read it)."""
        assert self._cookie is not None
        secure = "; Secure" if self.secure else ""
        return f"{COOKIE_NAME}={self._cookie}; Path=/; HttpOnly; SameSite=Strict{secure}"

    # -- connections per address -------------------------------------------------

    def open(self, client: str | None) -> Refused | None:
        """Count a WebSocket connection from ``client``, or refuse it (429) at the limit."""
        if self.max_connections_per_address and client is not None:
            if self._connections[client] >= self.max_connections_per_address:
                return Refused(
                    429,
                    "too_many_connections",
                    f"this address already has {self.max_connections_per_address} open connection(s), "
                    "the server's limit; close one and try again",
                )
            self._connections[client] += 1
        return None

    def close(self, client: str | None) -> None:
        """A connection counted by :meth:`open` has ended."""
        if self.max_connections_per_address and client is not None and self._connections[client] > 0:
            self._connections[client] -= 1
            if not self._connections[client]:
                del self._connections[client]

    def connections(self, client: str) -> int:
        """How many connections :meth:`open` counts for ``client`` now."""
        return self._connections[client]
