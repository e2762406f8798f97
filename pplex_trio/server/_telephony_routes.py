"""A phone carrier's HTTP side: the answer route that connects a call to its stream, and Twilio's signatures.

A Twilio number's webhook is ``https://HOST/telephony/twilio/answer?token=…&persona=…``:
Twilio fetches it when a call comes in, and the TwiML it gets back opens a
stream to ``wss://HOST/telephony/twilio`` with the persona, the voice and the
token as the stream's parameters (``docs/TELEPHONY.md``).  With
``--twilio-auth-token``, Twilio's requests must be signed: the answer (its URL
and form) and the stream's upgrade (its URL) are refused with 403 otherwise.
"""

from __future__ import annotations

import logging
from typing import Any

from quart import Response, jsonify, request
from quart_trio import QuartTrio

from ..protocol import ProtocolError, conversation_from_params, parse_query, twilio
from ._asgi_websocket import AsgiWebSocket
from ._context import ServerContext

logger = logging.getLogger(__name__)

TWILIO_STREAM_PATH = "/telephony/twilio"
TWILIO_ANSWER_PATH = "/telephony/twilio/answer"
# What the answer URL's query may set (the official client's names too); the stream gets persona and voice.
ANSWER_NAMES = ("persona", "voice", "text_prompt", "voice_prompt")


def public_base(scheme: str, headers: Any) -> tuple[bool, str]:
    """Whether the carrier reached us over TLS, and the host it used: behind a proxy, what its
    ``X-Forwarded-Proto`` / ``X-Forwarded-Host`` say (their first value), else the request's own."""
    proto = (headers.get("X-Forwarded-Proto") or "").split(",")[0].strip().lower()
    host = (headers.get("X-Forwarded-Host") or headers.get("Host") or "").split(",")[0].strip()
    return scheme in ("https", "wss") or proto == "https", host


def _url(scheme: str, host: str, path: str, query: bytes) -> str:
    text = query.decode("latin-1")
    return f"{scheme}://{host}{path}" + (f"?{text}" if text else "")


def twilio_upgrade_signed(ws: AsgiWebSocket, auth_token: str | None) -> bool:
    """Whether a stream's upgrade is Twilio's (always, without an auth token): signed over its URL alone."""
    if auth_token is None:
        return True
    secure, host = public_base(ws.scheme, ws.headers)
    url = _url("wss" if secure else "ws", host, ws.path, ws.query_string)
    return twilio.signature_matches(ws.headers.get(twilio.SIGNATURE_HEADER), auth_token, url)


def add_telephony_routes(app: QuartTrio, server: ServerContext) -> None:
    settings = server.settings

    @app.route(TWILIO_ANSWER_PATH, methods=["GET", "POST"])
    async def twilio_answer() -> Response | tuple[Response, int]:
        secure, host = public_base(request.scheme, request.headers)
        if settings.twilio_auth_token is not None:
            form = (await request.form).items(multi=True) if request.method == "POST" else ()
            url = _url("https" if secure else "http", host, request.path, request.query_string)
            if not twilio.signature_matches(request.headers.get(twilio.SIGNATURE_HEADER), settings.twilio_auth_token,
                                            url, form):
                logger.info("refused %s %s from %s: no valid %s (403)", request.method, request.path,
                            request.remote_addr, twilio.SIGNATURE_HEADER)
                return jsonify(error=f"this request has no valid {twilio.SIGNATURE_HEADER}: only Twilio, with the "
                               "auth token this server was given, may ask for the answer"), 403
        try:
            query = parse_query(request.query_string)
            conversation = conversation_from_params({k: v for k, v in query.items() if k in ANSWER_NAMES},
                                                    max_prompt_chars=settings.max_prompt_chars,
                                                    voices=server.voices())
            parameters = {"persona": conversation.persona} if conversation.persona else {}
            if conversation.voice is not None:
                parameters["voice"] = conversation.voice
            if settings.auth_token is not None:
                parameters["token"] = settings.auth_token  # the stream's URL cannot carry it
            document = twilio.answer_document(f"{'wss' if secure else 'ws'}://{host}{TWILIO_STREAM_PATH}",
                                              parameters)
        except ProtocolError as exc:
            return jsonify(error=exc.message), 400
        return Response(document, content_type="text/xml")
