"""Phone carriers' HTTP side: the answer route that connects a call to its stream, and the carriers' signatures.

Each carrier (:data:`CARRIERS`) has a stream at ``/telephony/<carrier>`` and
an answer route at ``/telephony/<carrier>/answer?token=…&persona=…&voice=…``
(GET or POST): the carrier fetches it when a call comes in, and the document it
gets back (Twilio's TwiML, Telnyx's TeXML, Plivo's XML, the URL Exotel's
Voicebot applet asks for) opens a stream to ``wss://HOST/telephony/<carrier>``
that carries the persona, the voice and the token (``docs/TELEPHONY.md``).
Given the carrier's secret (``--twilio-auth-token``, ``--telnyx-public-key``,
``--plivo-auth-token``), its requests to the answer route must be signed, and
are refused with 403 otherwise; so must Twilio's stream upgrade (its URL), the
only one a carrier signs.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from quart import Response, jsonify, request
from quart_trio import QuartTrio

from ..protocol import ProtocolError, conversation_from_params, exotel, parse_query, plivo, telephony, telnyx, twilio
from ._context import ServerContext
from ._settings import ServerSettings
from .transport import AsgiWebSocket

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SignedRequest:
    """What a carrier may sign of a request to the answer route."""

    url: str  # as the carrier asked for it: the public scheme and host, the path and the query
    headers: Any
    form: list[tuple[str, str]]  # a POST's form fields (none for a GET)
    body: bytes


@dataclasses.dataclass(frozen=True)
class Signature:
    """How a carrier signs its requests: the header that carries the signature, the operator's secret for it
    (None: not configured, nothing checked), and whether a request bears a valid one, given that secret."""

    header: str
    secret: Callable[[ServerSettings], str | None]
    valid: Callable[[SignedRequest, str], bool]


def _twilio_valid(signed: SignedRequest, auth_token: str) -> bool:
    return twilio.signature_matches(signed.headers.get(twilio.SIGNATURE_HEADER), auth_token, signed.url, signed.form)


def _telnyx_valid(signed: SignedRequest, public_key: str) -> bool:
    return telnyx.signature_matches(
        signed.headers.get(telnyx.SIGNATURE_HEADER),
        signed.headers.get(telnyx.TIMESTAMP_HEADER),
        signed.body,
        telnyx.public_key(public_key),
        now=time.time(),
    )


def _plivo_valid(signed: SignedRequest, auth_token: str) -> bool:
    return plivo.signature_matches(
        signed.headers.get(plivo.SIGNATURE_HEADER),
        signed.headers.get(plivo.NONCE_HEADER),
        auth_token,
        signed.url,
        signed.form,
    )


@dataclasses.dataclass(frozen=True)
class CarrierKind:
    """What the server needs of a carrier: its stream's parser, its answer document and that document's type,
    and how it signs its requests to the answer route (None: it does not)."""

    new: Callable[[], telephony.Carrier]
    answer: Callable[[str, Mapping[str, str]], str]  # (the stream's URL, the parameters) → the document
    content_type: str
    signature: Signature | None = None


CARRIERS = {
    "twilio": CarrierKind(
        twilio.TwilioCarrier,
        twilio.answer_document,
        "text/xml",
        Signature(twilio.SIGNATURE_HEADER, lambda s: s.twilio_auth_token, _twilio_valid),
    ),
    "telnyx": CarrierKind(
        telnyx.TelnyxCarrier,
        telnyx.answer_document,
        "text/xml",
        Signature(telnyx.SIGNATURE_HEADER, lambda s: s.telnyx_public_key, _telnyx_valid),
    ),
    "plivo": CarrierKind(
        plivo.PlivoCarrier,
        plivo.answer_document,
        "text/xml",
        Signature(plivo.SIGNATURE_HEADER, lambda s: s.plivo_auth_token, _plivo_valid),
    ),
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


async def _answer_refused(carrier: str, signature: Signature, secure: bool, host: str, secret: str) -> Response | None:
    body = await request.body
    form = list((await request.form).items(multi=True)) if request.method == "POST" else []
    signed = SignedRequest(
        _url("https" if secure else "http", host, request.path, request.query_string), request.headers, form, body
    )
    if signature.valid(signed, secret):
        return None
    logger.info(
        "refused %s %s from %s: no valid %s (403)", request.method, request.path, request.remote_addr, signature.header
    )
    return jsonify(
        error=f"this request has no valid {signature.header}: only {carrier.capitalize()}, with the "
        "secret this server was given, may ask for the answer"
    )


def add_telephony_routes(app: QuartTrio, server: ServerContext) -> None:
    """Add ``/telephony/<carrier>/answer`` to ``app``: the document that connects a carrier's call to its stream (404
    for an unknown carrier, 403 for an unsigned request when the carrier's secret is set, 400 for bad parameters).
    """
    settings = server.settings

    @app.route("/telephony/<carrier>/answer", methods=["GET", "POST"])
    async def telephony_answer(carrier: str) -> Response | tuple[Response, int]:
        kind = CARRIERS.get(carrier)
        if kind is None:
            return jsonify(error=f"no carrier {carrier[:40]!r} here: one of {', '.join(CARRIERS)}"), 404
        secure, host = public_base(request.scheme, request.headers)
        secret = kind.signature.secret(settings) if kind.signature is not None else None
        if kind.signature is not None and secret is not None:
            refused = await _answer_refused(carrier, kind.signature, secure, host, secret)
            if refused is not None:
                return refused, 403
        try:
            query = parse_query(request.query_string)
            conversation = conversation_from_params(
                {k: v for k, v in query.items() if k in ANSWER_NAMES},
                max_prompt_chars=settings.max_prompt_chars,
                voices=server.voices(),
            )
            parameters = {"persona": conversation.persona} if conversation.persona else {}
            if conversation.voice is not None:
                parameters["voice"] = conversation.voice
            if settings.auth_token is not None:
                parameters["token"] = settings.auth_token  # for the stream's session to check
            document = kind.answer(f"{'wss' if secure else 'ws'}://{host}/telephony/{carrier}", parameters)
        except ProtocolError as exc:
            return jsonify(error=exc.message), 400
        return Response(document, content_type=kind.content_type)
