"""The WebRTC routes: OpenAI's call flow for Realtime and Live, each call a session over a peer connection.

* ``POST /v1/realtime/calls``: an SDP offer, as ``application/sdp`` or OpenAI's multipart form (``sdp``, and
  ``session`` as JSON: the settings the call starts with); a client secret's settings are the base. Answered
  ``201`` with the SDP answer and ``Location: /v1/realtime/calls/{call_id}``.
* ``POST /v1/live/sessions``: ``{"session": {...}, "transport": {"type": "webrtc", "sdp": OFFER}}`` (the
  ``openai`` SDK's ``client.live.create``), answered ``201`` with ``{"session": {"id"}, "transport": {"type",
  "sdp"}}``.
* ``POST /v1/realtime/calls/{id}`` and ``POST /v1/live/sessions/{id}`` with a new offer (``application/sdp``):
  the caller's network changed (an ICE restart); the answer comes back and the call goes on (``200``).
* ``POST .../{id}/hangup``: end the call now.

Refusals are OpenAI's error bodies: a bad offer or bad settings ``400``, a server that takes no call now ``503``.
Routes only: the calls are ``webrtc.CallDesk``'s, the protocols ``sessions``'.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Any

from quart import Response, jsonify, request

from ..protocol import Dialect, EventError, SessionConfig, check_offer, session_settings
from ._client_secret_routes import error_response as _error
from ._setting_types import Framing
from .sessions import NO_TRANSCRIBER, LiveOverWebRtc, RealtimeOverWebRtc, Session
from .transport import GRANT_KEY
from .webrtc import CallDesk, CallRefused

logger = logging.getLogger(__name__)


def add_webrtc_routes(app: Any, server: Any, model: str) -> None:
    """Add the routes to ``app`` (Quart); the calls run on ``server.calls``; ``model``: the sessions' model name."""
    settings = server.settings
    limits = {"max_prompt_chars": settings.max_prompt_chars, "voices": server.voices}
    align = settings.framing is Framing.ALIGNED

    @app.post("/v1/realtime/calls")
    async def realtime_call() -> tuple[Response, int]:
        try:
            offer, session = await _realtime_request()
            grant = request.scope.get(GRANT_KEY)  # a client secret's settings
            base = grant if isinstance(grant, SessionConfig) else None
            config = session_settings(session, base=base, **limits)
            if config.transcription is not None and server.engine.transcript_delay is None:
                raise EventError(
                    NO_TRANSCRIBER, param="session.audio.input.transcription", code="transcription_unavailable"
                )
        except EventError as exc:
            return _error(exc, 400)
        wire = RealtimeOverWebRtc(Dialect.GA, model=model, align=align, config=config, **limits)
        opened = await _open(offer, wire, prefix="rtc_")
        if isinstance(opened, tuple):
            return opened
        response = Response(opened.answer, content_type="application/sdp")
        response.headers["Location"] = f"/v1/realtime/calls/{opened.call_id}"
        return response, 201

    @app.post("/v1/live/sessions")
    async def live_call() -> tuple[Response, int]:
        try:
            offer, session = await _live_request()
            session_id = f"sess_{secrets.token_hex(12)}"
            limit = settings.max_session_seconds
            wire = LiveOverWebRtc(
                session=session,
                model=model,
                session_id=session_id,
                expires_at=int(time.time() + limit) if limit else 0,
                align=align,
                **limits,
            )
        except EventError as exc:
            return _error(exc, 400)
        opened = await _open(offer, wire, prefix="", call_id=session_id)
        if isinstance(opened, tuple):
            return opened
        body = {"session": {"id": opened.call_id}, "transport": {"type": "webrtc", "sdp": opened.answer}}
        return jsonify(body), 201

    async def _open(offer: bytes, wire: Any, *, prefix: str, call_id: str | None = None) -> Any:
        """The call answered (``.answer``, ``.call_id``), or the error response that refuses it."""
        try:
            check_offer(offer)
        except EventError as exc:
            return _error(exc, 400)
        unready = server.unready()
        if unready is not None:
            return _error(EventError(unready.message, code=unready.value, kind="server_error"), 503)

        async def converse(socket: Any) -> None:
            await Session(socket, wire, server).run()

        desk: CallDesk = server.calls
        try:
            opened_id, answer = await desk.open(
                offer.decode(), converse, client=request.remote_addr, prefix=prefix, call_id=call_id
            )
        except CallRefused as exc:
            return _error(EventError(exc.message, code="call_refused", kind="server_error"), exc.status)
        logger.info("WebRTC call %s (%s) from %s answered", opened_id, wire.name, request.remote_addr)
        return _Opened(opened_id, answer)

    @app.post("/v1/realtime/calls/<call_id>")
    @app.post("/v1/live/sessions/<call_id>")
    async def restart(call_id: str) -> tuple[Response, int] | Response:
        body = await _body()
        try:
            check_offer(body)
        except EventError as exc:
            return _error(exc, 400)
        try:
            answer = await server.calls.restart(call_id, body.decode())
        except CallRefused as exc:
            return _error(EventError(exc.message, code="call_refused", kind="server_error"), exc.status)
        if answer is None:
            return _no_call(call_id)
        logger.info("WebRTC call %s: new offer answered (ICE restart)", call_id)
        return Response(answer, content_type="application/sdp")

    @app.post("/v1/realtime/calls/<call_id>/hangup")
    @app.post("/v1/live/sessions/<call_id>/hangup")
    async def hangup(call_id: str) -> tuple[Response, int] | Response:
        if not server.calls.hang_up(call_id):
            return _no_call(call_id)
        return jsonify({})


class _Opened:
    def __init__(self, call_id: str, answer: str) -> None:
        self.call_id, self.answer = call_id, answer


async def _realtime_request() -> tuple[bytes, Any]:
    """The offer and the ``session`` of a Realtime call's request: ``application/sdp``, or the multipart form."""
    if request.mimetype == "multipart/form-data":
        form, files = await request.form, await request.files
        sdp = form["sdp"].encode() if "sdp" in form else _read(files.get("sdp"))
        session = form.get("session") if "session" in form else _read(files.get("session"))
        if sdp is None:
            raise EventError("the form has no sdp part (the SDP offer)", param="sdp")
        try:
            parsed = None if session is None else json.loads(session)
        except ValueError:
            raise EventError("the form's session part is not JSON", param="session") from None
        return sdp, parsed
    return await _body(), None


async def _body() -> bytes:
    body = await request.get_data(as_text=False)
    return body.encode() if isinstance(body, str) else body


def _read(part: Any) -> bytes | None:
    return None if part is None else part.read()


async def _live_request() -> tuple[bytes, dict[str, Any]]:
    """The offer and the session of a Live call's JSON body."""
    try:
        body = json.loads(await _body() or b"null")
    except ValueError:
        raise EventError("the body is not JSON", param=None) from None
    if not isinstance(body, dict):
        raise EventError("the body must be a JSON object with session and transport", param=None)
    transport, session = body.get("transport"), body.get("session", {})
    if (
        not isinstance(transport, dict)
        or transport.get("type") != "webrtc"
        or not isinstance(transport.get("sdp"), str)
    ):
        raise EventError('transport must be {"type": "webrtc", "sdp": <the SDP offer>}', param="transport")
    if not isinstance(session, dict):
        raise EventError("session must be an object", param="session")
    return transport["sdp"].encode(), session


def _no_call(call_id: str) -> tuple[Response, int]:
    return _error(EventError(f"no call {call_id[:64]!r} is up on this server", code="call_not_found"), 404)
