"""The application: Quart-Trio's HTTP routes, and the conversation WebSockets beside it.

The conversation routes and the voice upload are served on ASGI directly
(``_asgi_websocket.py``, ``_voice_routes.py``); every other route is Quart's.  Routes only: the work lives elsewhere.
"""

from __future__ import annotations

import logging
import pathlib
import secrets
import time
from collections.abc import Callable, Sequence
from typing import TypedDict

import trio
from quart import Response, jsonify, request, send_from_directory
from quart_trio import QuartTrio
from werkzeug.exceptions import NotFound

from .._version import __version__
from ..protocol import twilio
from ._client_secret_routes import add_client_secret_routes
from ._context import ServerContext
from ._server_state import Unready
from ._setting_types import Framing
from ._status import StatusSampler, status_report
from ._telephony_routes import CARRIERS, STREAM_PATHS, add_telephony_routes, twilio_upgrade_signed
from ._webrtc_routes import add_webrtc_routes
from .records import add_record_routes
from .sessions import (
    SUBPROTOCOL,
    LiveProtocol,
    MoshiProtocol,
    RawProtocol,
    RealtimeProtocol,
    Session,
    TelephonyProtocol,
    dialect_of,
)
from .transport import (
    MAX_TICKET_CHARS,
    ROOT_QUERY,
    AsgiWebSocket,
    ConversationRouter,
    find_official_client,
    official_index,
    queue_status,
)
from .voices import VoiceUpload, add_voice_routes

logger = logging.getLogger(__name__)

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent
# The WebSocket routes (Live's also without /v1: the openai SDK's path under a websocket_base_url without it).
CONVERSATION_PATHS = frozenset(
    {"/api/chat", "/v1/audio/duplex", "/v1/realtime", "/v1/live/sessions", "/live/sessions", *STREAM_PATHS}
)
# Those whose session checks the token (a carrier's stream: its URL may carry none; the gate lets it through).
TOKEN_IN_SESSION_PATHS = frozenset(STREAM_PATHS)
# Where a client secret opens a call (once), with its settings: the Realtime WebSocket, and its WebRTC offer.
SECRET_PATHS = frozenset({"/v1/realtime"})
SECRET_POSTS = frozenset({"/v1/realtime/calls"})
# The WebRTC call routes (and those of a call below them): a page of an allowed origin may call them (CORS).
CALL_ROUTES = ("/v1/realtime/calls", "/v1/live/sessions")


def default_static_dir() -> pathlib.Path:
    """The web UI: bundled in the wheel, or ``static/`` of a source checkout."""
    bundled = PACKAGE_DIR / "_static"
    return bundled if bundled.is_dir() else PACKAGE_DIR.parent / "static"


def _count_tasks(task: trio.lowlevel.Task) -> int:
    """Trio tasks alive under ``task`` (itself included): a leak shows as growth between idle moments."""
    return 1 + sum(_count_tasks(child) for nursery in task.child_nurseries for child in nursery.child_tasks)


class _Limits(TypedDict):
    """What every protocol of a conversation is built with."""

    max_prompt_chars: int
    voices: Callable[[], Sequence[str]]


def create_app(server: ServerContext, status: StatusSampler | None = None) -> ConversationRouter:
    """The whole ASGI application: the conversation WebSockets, then Quart (``.app``) for the rest;
    ``status`` is the sampler ``serve`` runs (without one, ``/api/status`` has no history)."""
    settings = server.settings
    model_id = _model_id(server)
    limits = _Limits(max_prompt_chars=settings.max_prompt_chars, voices=server.voices)

    async def chat(ws: AsgiWebSocket) -> None:
        wire = MoshiProtocol(
            server.encoders, align=settings.framing is Framing.ALIGNED, pings="origin" in ws.headers, **limits
        )  # a browser: see MoshiProtocol
        await Session(ws, wire, server).run()

    async def duplex(ws: AsgiWebSocket) -> None:
        await Session(ws, RawProtocol(**limits), server).run()

    async def realtime(ws: AsgiWebSocket) -> None:
        offered = ws.requested_subprotocols
        wire = RealtimeProtocol(
            dialect_of(ws.headers, offered),
            model=model_id,
            align=settings.framing is Framing.ALIGNED,
            subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None,
            config=ws.grant,  # a client secret's settings, as if sent in a session.update first
            **limits,
        )
        await Session(ws, wire, server).run()

    async def live(ws: AsgiWebSocket) -> None:
        limit = settings.max_session_seconds
        wire = LiveProtocol(
            model=model_id,
            session_id=f"sess_{secrets.token_hex(12)}",
            expires_at=int(time.time() + limit) if limit else 0,
            align=settings.framing is Framing.ALIGNED,
            **limits,
        )
        await Session(ws, wire, server).run()

    async def telephony_stream(ws: AsgiWebSocket) -> None:
        carrier = STREAM_PATHS[ws.path]
        if carrier == "twilio" and not twilio_upgrade_signed(ws, settings.twilio_auth_token):
            logger.info("refused WebSocket %s from %s: no valid %s (403)", ws.path, ws.client, twilio.SIGNATURE_HEADER)
            await ws.refuse(403, b'{"error": "no valid X-Twilio-Signature"}')
            return
        wire = TelephonyProtocol(
            CARRIERS[carrier].new(), token=settings.auth_token, align=settings.framing is Framing.ALIGNED, **limits
        )
        await Session(ws, wire, server).run()

    routes = {
        "/api/chat": chat,
        "/v1/audio/duplex": duplex,
        "/v1/realtime": realtime,
        "/v1/live/sessions": live,
        "/live/sessions": live,
        **{path: telephony_stream for path in STREAM_PATHS},
    }
    assert frozenset(routes) == CONVERSATION_PATHS
    return ConversationRouter(
        create_http_app(server, status or StatusSampler(server)), routes, uploads={"/api/voices": VoiceUpload(server)}
    )


def _model_id(server: ServerContext) -> str:
    """The model's name for OpenAI clients: ``--model``, with auto's choice (the engine's name) and without
    the echo engine's options (``echo:delay=2`` is ``echo``)."""
    model = server.settings.model
    if model == "auto" or model.startswith("echo:"):
        return server.engine.name.split(" ")[0]
    return model


def create_http_app(server: ServerContext, status: StatusSampler) -> QuartTrio:
    """The Quart app: pages, the web UI, probes, metrics and the JSON routes."""
    app = QuartTrio(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024
    static_dir = server.settings.static_dir or default_static_dir()
    # Our own UI at /, the official client (if cached locally) at /official/.
    official_dir = None if server.settings.static_dir else find_official_client(server.settings.model)

    settings = server.settings
    model_id = _model_id(server)

    @app.get("/v1/models")
    async def models() -> Response:
        # What OpenAI clients list before they connect; any ``model`` is accepted by /v1/realtime and
        # /v1/live/sessions.
        return jsonify(
            object="list", data=[{"id": model_id, "object": "model", "created": 0, "owned_by": "pplex-trio"}]
        )

    @app.get("/health")
    async def health() -> tuple[Response, int]:
        stats = server.actor.statistics()
        unready = server.unready(when_full=False)
        status = "ok" if unready is None else unready.health
        body = jsonify(
            status=status,
            slots_total=stats.slots_total,
            slots_free=stats.slots_free,
            queued=stats.queued,
            slots=stats.slots,
            sessions=len(server.sessions),
            tick_path=server.engine.tick_path,
            engine_state=stats.state.value,
        )
        return body, 503 if unready is Unready.ENGINE_STALLED else 200

    @app.get("/ready")
    async def ready() -> tuple[Response, int]:
        # For load balancers: can this replica take a conversation now? (/health: is it alive?)
        stats = server.actor.statistics()
        unready = server.unready()
        body = jsonify(
            ready=unready is None,
            reason=None if unready is None else unready.value,
            message=None if unready is None else unready.message,
            slots_free=stats.slots_free,
            queued=stats.queued,
            queue_size=settings.queue_size,
        )
        return body, 200 if unready is None else 503

    @app.get("/metrics")
    async def metrics() -> Response:
        root = trio.lowlevel.current_root_task()
        assert root is not None  # a handler runs inside trio.run
        server.metrics.trio_tasks.set(_count_tasks(root))
        unready = server.unready()
        for reason in Unready:
            server.metrics.unready.labels(reason.value).set(reason is unready)
        return Response(server.metrics.render(), content_type=server.metrics.content_type)

    @app.get("/api/info")
    async def info() -> Response:
        engine = server.engine
        return jsonify(
            model=engine.name,
            slots=engine.num_slots,
            version=__version__,
            sample_rate=engine.sample_rate,
            frame_size=engine.frame_size,
            max_prompt_chars=server.settings.max_prompt_chars,
            queue_size=server.settings.queue_size,
            official_client="/official/" if official_dir is not None else None,
            transcribes_caller=engine.transcript_delay is not None,
        )

    add_voice_routes(app, server)
    add_telephony_routes(app, server)
    add_record_routes(app, server)
    add_client_secret_routes(app, server, model_id)
    add_webrtc_routes(app, server, model_id)

    @app.get("/api/sessions")
    async def sessions() -> Response:
        return jsonify(sessions=[s.describe() for s in sorted(server.sessions, key=lambda s: s.id)])

    @app.get("/api/status")
    async def status_json() -> Response:
        return jsonify(status_report(server, status))

    @app.get("/status")
    async def status_page() -> Response:
        return await send_from_directory(static_dir, "status.html")

    @app.get("/api/queue")
    async def queue() -> tuple[Response, int] | Response:
        # The web UI's queue position (see _queue_status.py).
        ticket = request.args.get("ticket", "")
        if not ticket or len(ticket) > MAX_TICKET_CHARS:
            return jsonify(error=f"give ?ticket=<the ticket passed to /api/chat, 1-{MAX_TICKET_CHARS} chars>"), 400
        status = queue_status(server.sessions, ticket, queued=server.actor.statistics().queued)
        if status is None:
            return jsonify(error="no open conversation has this ticket"), 404
        return jsonify(status)

    @app.get("/")
    async def index() -> Response:
        if official_dir is not None and ROOT_QUERY in request.args:
            return Response(official_index(official_dir), content_type="text/html; charset=utf-8")
        return await send_from_directory(static_dir, "index.html")

    if official_dir is not None:

        @app.get("/official/")
        async def official() -> Response:
            return Response(official_index(official_dir), content_type="text/html; charset=utf-8")

        @app.get("/official/<path:path>")
        async def official_file(path: str) -> Response:
            return await send_from_directory(official_dir, path)

    @app.get("/<path:path>")
    async def static_file(path: str) -> Response:
        # send_from_directory refuses anything outside static_dir (404).
        try:
            return await send_from_directory(static_dir, path)
        except NotFound:
            # The official client's bundle asks for /assets/... from the site root.
            if official_dir is not None and path.startswith("assets/"):
                return await send_from_directory(official_dir, path)
            raise

    return app
