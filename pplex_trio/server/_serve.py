"""Running the server: the transport (``_transport``), the engine actor and the encoders in one nursery.

The nursery holds the engine actor, the encoders, the HTTP/WebSocket
transport, and (when we own the process) a signal watcher.  Shutdown is
bounded whatever the clients do: every conversation is told 1001 (going away)
and gets ``--shutdown-grace`` to close, then the transport stops, gives open
connections the same grace and aborts the ones a write still holds, then the
actor and the encoders stop.

Before that, a SIGTERM drains for ``--drain-seconds``: ``/ready`` says 503
and new conversations are refused, while the live ones go on until they end
or the drain is over (a second signal ends it early, a third stops at once).
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import ipaddress
import logging
import signal
import socket
from collections.abc import Sequence
from functools import partial
from typing import Any

import hypercorn.config
import trio

from ..engine import Engine
from ..protocol import AccessPolicy, Refused
from ._app import CALL_ROUTES, CONVERSATION_PATHS, SECRET_PATHS, SECRET_POSTS, TOKEN_IN_SESSION_PATHS, create_app
from ._context import ServerContext
from ._server_state import ServerState
from ._settings import ServerSettings
from ._status import StatusSampler
from .transport import AccessGate, AccessLog, Certificate, prepare_certificate, serve_http

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServerHandle:
    """What :func:`serve` hands back through ``task_status`` once it listens."""

    server: ServerContext
    binds: list[str]
    _stop: trio.Event

    @property
    def port(self) -> int:
        """The port the first bind listens on (the one chosen when ``--port 0``)."""
        return int(self.binds[0].rsplit(":", 1)[1])

    @property
    def http_url(self) -> str:
        """The first bind's base URL, ``http://HOST:PORT`` (``https://`` with TLS)."""
        return self.binds[0]

    @property
    def ws_url(self) -> str:
        """The first bind's base URL for WebSockets, ``ws://HOST:PORT`` (``wss://`` with TLS)."""
        return "ws" + self.binds[0].removeprefix("http")  # http → ws, https → wss

    async def shutdown(self) -> None:
        """Close every conversation with 1001 within the grace period, then stop."""
        await _shutdown(self.server, self._stop)

    async def drain_then_shutdown(self, seconds: float) -> None:
        """What SIGTERM does: refuse new conversations, let the live ones go on ``seconds``, then shut down."""
        await _drain_then_shutdown(self.server, self._stop, seconds)


async def _drain(server: ServerContext, seconds: float) -> None:
    """Not ready, no new conversations; wait (at most ``seconds``) until the live ones have ended."""
    if seconds <= 0:
        return
    with trio.move_on_after(seconds) as drain:
        if not server.begin_drain(drain):  # (a second signal cancels it)
            return
        logger.info(
            "draining: no new conversations; %d live one(s) may go on for up to %g s", len(server.sessions), seconds
        )
        while server.sessions:
            await trio.sleep(0.05)
    logger.info("drain over: %d conversation(s) left", len(server.sessions))


async def _shutdown(server: ServerContext, stop: trio.Event) -> None:
    if not server.begin_shutdown():
        return
    logger.info("shutting down: closing %d conversation(s)", len(server.sessions))
    with trio.move_on_after(server.settings.shutdown_grace):
        while server.sessions:
            await trio.sleep(0.01)
    stop.set()


def hypercorn_config(settings: ServerSettings) -> hypercorn.config.Config:
    """Hypercorn's config for ``settings``: binds, limits and timeouts derived from ours (its message limit is a
    backstop to the transport guard's).
    """
    config = hypercorn.config.Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    # The transport guard enforces our limit at the frame header; hypercorn's is a backstop.
    config.websocket_max_message_size = 2 * settings.max_message_bytes
    # A live peer has these pings to answer; one that sends nothing is given up by the transport (serve_http).
    config.websocket_ping_interval = settings.client_timeout / 3
    config.keep_alive_timeout = min(5.0, settings.client_timeout)  # an idle or half-sent HTTP request
    config.graceful_timeout = settings.shutdown_grace
    config.ssl_handshake_timeout = settings.client_timeout
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


class ListenError(OSError):
    """The server cannot listen where it was asked to; the message says where and why."""


def bind_sockets(settings: ServerSettings) -> list[socket.socket]:
    """Bound, listening sockets for ``--host``/``--port`` (before any task starts, so errors are plain)."""
    config = hypercorn_config(settings)
    where = f"{settings.host}:{settings.port}"
    try:
        sockets = config.create_sockets().insecure_sockets
        for sock in sockets:
            sock.listen(config.backlog)
    except socket.gaierror as exc:
        raise ListenError(
            f"cannot listen on {where}: the host {settings.host!r} does not resolve "
            f"({exc.strerror}); use an address of this machine, such as 127.0.0.1 or 0.0.0.0"
        ) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(
                f"cannot listen on {where}: the address is already in use (another server on port "
                f"{settings.port}?); stop it or pass another --port"
            ) from None
        raise ListenError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    return sockets


def socket_listeners(sockets: list[socket.socket]) -> list[trio.SocketListener]:
    """Trio listeners on the sockets :func:`bind_sockets` bound."""
    return [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]


async def serve(
    settings: ServerSettings,
    engine: Engine,
    *,
    handle_signals: bool = False,
    listeners: Sequence[trio.abc.Listener[trio.SocketStream]] | None = None,
    certificate: Certificate | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until shut down (by a signal if ``handle_signals``, or the handle).

    ``listeners`` give the connections: by default sockets bound here for
    ``--host``/``--port``; the command binds them first (:func:`bind_sockets`,
    :func:`socket_listeners`), so that a port in use is said before a model
    loads.  Any listener whose streams behave as socket streams will do (see
    ``_transport.serve_http``); the tests serve over an in-memory network.
    ``certificate`` is the one :func:`prepare_certificate` gave (default: prepared here).
    """
    if certificate is None:
        certificate = tls_certificate(settings)
    server = ServerContext.create(settings, engine)
    status = StatusSampler(server)
    policy = AccessPolicy(
        token=settings.auth_token,
        allowed_origins=settings.origins,
        max_connections_per_address=settings.max_connections_per_ip,
        open_paths=OPEN_PATHS,
        in_session_paths=TOKEN_IN_SESSION_PATHS,
        secure=certificate is not None,
        client_secrets=server.client_secrets,
        secret_paths=SECRET_PATHS,
        secret_posts=SECRET_POSTS,
    )
    app: Any = AccessGate(
        create_app(server, status),
        policy,
        on_refusal=lambda reason: server.metrics.refused.labels(reason).inc(),
        busy=partial(_busy, server) if settings.refuse_busy_upgrades else None,
        cross_origin=CALL_ROUTES,
    )
    if settings.access_log:
        app = AccessLog(app)
    stop = trio.Event()
    if listeners is None:
        listeners = socket_listeners(bind_sockets(settings))
    _quiet_garbage_collector()
    async with trio.open_nursery() as nursery:
        if handle_signals:  # before anything listens: a Ctrl-C at any moment from here is a clean stop
            await nursery.start(_watch_signals, server, stop)
        await nursery.start(server.actor.run)
        await nursery.start(server.encoders.run)
        await nursery.start(status.run)  # the status page's history: reads the tick's metrics once a second
        assert server.calls is not None
        await nursery.start(server.calls.run)  # the WebRTC calls (the loop thread aiortc needs starts with the first)
        if server.records is not None:  # (records past retention or quota are deleted before anything listens)
            await nursery.start(server.records.run)
        # The transport's write deadline comes a second after the session's own, so a session that gives
        # up on a client says so (and tries to tell it) before the transport drops the connection.
        http = partial(
            serve_http,
            app,
            hypercorn_config(settings),
            listeners,
            write_timeout=settings.client_timeout + 1,
            read_timeout=settings.client_timeout,
            max_message_bytes=settings.max_message_bytes,
            shutdown_trigger=stop.wait,
            on_refusal=lambda refusal: server.metrics.errors.labels("transport").inc(),
            ssl_context=certificate.server_context() if certificate is not None else None,
        )
        binds = await nursery.start(_http, http, nursery)
        handle = ServerHandle(server, binds, stop)
        logger.info("serving %s with %d slot(s) on %s", engine.name, engine.num_slots, ", ".join(binds))
        _log_exposure(settings, certificate, handle.port)
        task_status.started(handle)


OPEN_PATHS = frozenset({"/health", "/ready"})  # load balancers and probes check them without the token


def _busy(server: ServerContext, path: str) -> Refused | None:
    """``--refuse-busy-upgrades``: a conversation this server cannot take now is refused before its upgrade."""
    if path not in CONVERSATION_PATHS:
        return None
    unready = server.unready()
    return None if unready is None else Refused(503, unready.value, unready.message)


def tls_certificate(settings: ServerSettings) -> Certificate | None:
    """The certificate ``--ssl``/``--certfile`` ask for (made if needed), logged with its fingerprint."""
    certificate = prepare_certificate(
        ssl_dir=settings.ssl_dir, certfile=settings.certfile, keyfile=settings.keyfile, host=settings.host
    )
    if certificate is not None:
        logger.info(
            "TLS: certificate %s, SHA-256 fingerprint %s, valid until %s",
            certificate.cert_path,
            certificate.fingerprint,
            certificate.not_after.date(),
        )
    return certificate


def _log_exposure(settings: ServerSettings, certificate: Certificate | None, port: int) -> None:
    """Where to open the server, and a warning for each way in which it is exposed."""
    loopback = settings.host in ("127.0.0.1", "::1", "localhost")
    if certificate is not None:
        host = settings.host
        if host in ("0.0.0.0", "::"):  # every address: name the machine's LAN address, as another machine sees it
            lan = [name for name in certificate.names if _is_lan_ipv4(name)]
            host = lan[0] if lan else "localhost"
        where = f"[{host}]" if ":" in host else host
        note = (
            " (the certificate is self-signed: the browser asks once to accept it; compare the fingerprint)"
            if certificate.self_signed
            else ""
        )
        logger.info("open https://%s:%d/%s", where, port, note)
    elif not loopback:
        logger.warning(
            "listening on %s without TLS: browsers on other machines will not give the page the "
            "microphone; serve with --ssl DIR (a self-signed certificate is made there)",
            settings.host,
        )
    if settings.auth_token is None and not loopback:
        logger.warning(
            "listening on %s without an access token: anyone who can reach the port can use the "
            "server; set PPLEX_TRIO_AUTH_TOKEN (see docs/SECURITY.md)",
            settings.host,
        )


def _is_lan_ipv4(name: str) -> bool:
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # a DNS name
    return address.version == 4 and not address.is_loopback


def _quiet_garbage_collector() -> None:
    """Keep the cyclic garbage collector from stalling the 80 ms lockstep.

    Everything alive at startup (torch, the model, the app) is frozen out of
    the collector's sight, so a full collection scans only what conversations
    allocate: measured here, full collections took 60-180 ms before (each one
    a late tick for every conversation) and a few ms after.
    """
    gc.collect()
    gc.freeze()


async def _http(
    http: Any, nursery: trio.Nursery, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
) -> None:
    await http(task_status=task_status)
    nursery.cancel_scope.cancel()  # the transport is done: stop the actor, the encoders and the signal watcher


async def _watch_signals(
    server: ServerContext, stop: trio.Event, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                name = signal.Signals(signum).name
                if server.state is ServerState.STOPPING:
                    logger.warning("%s while shutting down: stopping now", name)
                    stop.set()
                    return
                if server.state is ServerState.DRAINING:
                    logger.warning("%s while draining: ending the drain", name)
                    server.end_drain()
                    continue
                logger.info("%s received", name)
                drain = server.settings.drain_seconds if signum == signal.SIGTERM else 0.0
                nursery.start_soon(_drain_then_shutdown, server, stop, drain)


async def _drain_then_shutdown(server: ServerContext, stop: trio.Event, seconds: float) -> None:
    await _drain(server, seconds)
    await _shutdown(server, stop)
