"""Phone carriers' HTTP side: the answer route that connects a call to its stream, and Twilio's signatures.

Each carrier (:data:`CARRIERS`) has a stream at ``/telephony/<carrier>`` and
an answer route at ``/telephony/<carrier>/answer?token=…&persona=…&voice=…``
(GET or POST): the carrier fetches it when a call comes in, and the document it
gets back (Twilio's TwiML, Telnyx's TeXML, Plivo's XML, the URL Exotel's
Voicebot applet asks for) opens a stream to ``wss://HOST/telephony/<carrier>``
that carries the persona, the voice and the token (``docs/TELEPHONY.md``).
With ``--twilio-auth-token``, Twilio's requests must be signed: the answer
(its URL and form) and the stream's upgrade (its URL) are refused with 403
otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from quart import Response, jsonify, request
from quart_trio import QuartTrio

from ..protocol import ProtocolError, conversation_from_params, exotel, parse_query, plivo, telephony, telnyx, twilio
from ._asgi_websocket import AsgiWebSocket
from ._context import ServerContext

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CarrierKind:
    """What the server needs of a carrier: its stream's parser, its answer document and that document's type."""

    new: Callable[[], telephony.Carrier]
    answer: Callable[[str, Mapping[str, str]], str]  # (the stream's URL, the parameters) → the document
    content_type: str


CARRIERS = {
    "twilio": CarrierKind(twilio.TwilioCarrier, twilio.answer_document, "text/xml"),
    "telnyx": CarrierKind(telnyx.TelnyxCarrier, telnyx.answer_document, "text/xml"),
    "plivo": CarrierKind(plivo.PlivoCarrier, plivo.answer_document, "text/xml"),
    "exotel": CarrierKind(exotel.ExotelCarrier, exotel.answer_document, "application/json"),
}
STREAM_PATHS = {f"/telephony/{name}": name for name in CARRIERS}
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


def _twilio_answer_refused(secure: bool, host: str, form: Any, auth_token: str) -> Response | None:
    url = _url("https" if secure else "http", host, request.path, request.query_string)
    if twilio.signature_matches(request.headers.get(twilio.SIGNATURE_HEADER), auth_token, url, form):
        return None
    logger.info("refused %s %s from %s: no valid %s (403)", request.method, request.path, request.remote_addr,
                twilio.SIGNATURE_HEADER)
    return jsonify(error=f"this request has no valid {twilio.SIGNATURE_HEADER}: only Twilio, with the auth token "
                   "this server was given, may ask for the answer")


def add_telephony_routes(app: QuartTrio, server: ServerContext) -> None:
    settings = server.settings

    @app.route("/telephony/<carrier>/answer", methods=["GET", "POST"])
    async def telephony_answer(carrier: str) -> Response | tuple[Response, int]:
        kind = CARRIERS.get(carrier)
        if kind is None:
            return jsonify(error=f"no carrier {carrier[:40]!r} here: one of {', '.join(CARRIERS)}"), 404
        secure, host = public_base(request.scheme, request.headers)
        if carrier == "twilio" and settings.twilio_auth_token is not None:
            form = (await request.form).items(multi=True) if request.method == "POST" else ()
            refused = _twilio_answer_refused(secure, host, form, settings.twilio_auth_token)
            if refused is not None:
                return refused, 403
        try:
            query = parse_query(request.query_string)
            conversation = conversation_from_params({k: v for k, v in query.items() if k in ANSWER_NAMES},
                                                    max_prompt_chars=settings.max_prompt_chars,
                                                    voices=server.voices())
            parameters = {"persona": conversation.persona} if conversation.persona else {}
            if conversation.voice is not None:
                parameters["voice"] = conversation.voice
            if settings.auth_token is not None:
                parameters["token"] = settings.auth_token  # for the stream's session to check
            document = kind.answer(f"{'wss' if secure else 'ws'}://{host}/telephony/{carrier}", parameters)
        except ProtocolError as exc:
            return jsonify(error=exc.message), 400
        return Response(document, content_type=kind.content_type)
