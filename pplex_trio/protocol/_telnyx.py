"""Telnyx media streaming, sans-IO: the stream's events, our messages, the TeXML answer, the signature.

A call answered with TeXML ``<Connect><Stream url="wss://…/telephony/telnyx"
bidirectionalMode="rtp">`` opens a bidirectional stream: Telnyx sends
``connected``, ``start`` (``call_control_id``, the ``<Parameter>``s of the
answer as ``custom_parameters``, ``media_format``: PCMU or PCMA at 8 kHz), then
``media`` (base64 RTP payloads, 20 ms), ``dtmf``, ``mark`` when what we sent
before a mark has played, ``error`` when it could not take one of our messages,
and ``stop`` when the call ends.  We send ``media`` (in the RTP codec the
answer asked for: PCMU), ``mark`` and ``clear``.  Telnyx's messages name the
stream (``stream_id``); ours need not.  Telnyx signs its webhooks (the TeXML
answer's request among them) with Ed25519 (:func:`signature_matches`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, ClassVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ._audio import Encoding, SampleFormat
from ._telephony import CallEvent, CallStart, EventReader, StreamEvents, connect_stream_document

RATE = 8_000
SIGNATURE_HEADER = "telnyx-signature-ed25519"
TIMESTAMP_HEADER = "telnyx-timestamp"
SIGNATURE_TOLERANCE = 300.0  # seconds a signed request stays valid either side of now (Telnyx's SDKs: 5 min)
# The start event's media_format.encoding (Telnyx's codec names; the media types too, as some of its docs show).
ENCODINGS = {
    "PCMU": Encoding.PCMU,
    "PCMA": Encoding.PCMA,
    "audio/x-mulaw": Encoding.PCMU,
    "audio/x-alaw": Encoding.PCMA,
}
REPLY_CODEC = "PCMU"  # the answer's bidirectionalCodec: what Telnyx plays of ours, whatever the call's codec
_read = EventReader("Telnyx media streaming", inbound=("inbound", "inbound_track"))


class TelnyxCarrier(StreamEvents):
    """One Telnyx stream (a :class:`~pplex_trio.protocol.telephony.Carrier`): parse its events, build ours."""

    name: ClassVar[str] = "telnyx"
    stream_key: ClassVar[str | None] = None

    def parse(self, message: bytes | str) -> CallEvent | None:
        """The event one Telnyx message carries: the caller's audio (inbound track only), the start, or a common event;
        None for others.
        """
        event = _read.load(message)
        kind = event["event"]
        if kind == "media":
            return _read.audio(event)
        if kind == "start":
            return self._start(event)
        return _read.common(event, kind)  # (else None: error, Telnyx's word that it could not take one of
        # ours, and events Telnyx may add)

    def _start(self, event: Mapping[str, Any]) -> CallStart:
        start = _read.object(event, "start")
        stream_id = _read.optional_text(event, "stream_id") or _read.optional_text(start, "stream_id")
        if stream_id is None:
            raise _read.malformed("the start event must carry a string stream_id")
        parameters = _read.parameters(start, "custom_parameters", "start")
        media_format = _read.media_format(start, "media_format", {"encoding": "PCMU", "sample_rate": RATE})
        encoding = ENCODINGS.get(str(media_format.get("encoding")))
        if encoding is None or media_format.get("sample_rate", RATE) != RATE or media_format.get("channels", 1) != 1:
            raise _read.unsupported(media_format, f"mono PCMU or PCMA at {RATE} Hz")
        self.stream_id = stream_id
        return CallStart(
            call_id=_read.optional_text(start, "call_control_id", "call_sid") or "",
            stream_id=stream_id,
            account_id=_read.optional_text(start, "user_id", "account_sid"),
            parameters=parameters,
            audio_format=SampleFormat(encoding, RATE),
            reply_format=SampleFormat(ENCODINGS[REPLY_CODEC], RATE),
        )


def answer_document(stream_url: str, parameters: Mapping[str, str]) -> str:
    """The TeXML that connects a call to a bidirectional RTP stream at ``stream_url`` (our audio in
    :data:`REPLY_CODEC`), handing it ``parameters`` (``custom_parameters`` in its start event).

    Raises :class:`ProtocolError` (``param``: the parameter) for a value XML cannot carry.
    """
    return connect_stream_document(stream_url, parameters, bidirectionalMode="rtp", bidirectionalCodec=REPLY_CODEC)


def public_key(text: str) -> Ed25519PublicKey:
    """The account's Ed25519 public key from its base64 text (Telnyx's portal: Keys & Credentials, Public Key).

    Raises :class:`ValueError`, saying what to give, when the text is not 32 bytes in base64."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) != 32:
        raise ValueError(
            "a Telnyx public key is 32 bytes in base64 (44 characters, ending in =): copy it from "
            "Telnyx's portal, Account Settings, Keys & Credentials, Public Key"
        )
    return Ed25519PublicKey.from_public_bytes(raw)


def signature_matches(
    signature: str | None,
    timestamp: str | None,
    body: bytes,
    key: Ed25519PublicKey,
    now: float,
    tolerance: float = SIGNATURE_TOLERANCE,
) -> bool:
    """Whether ``signature`` (the ``telnyx-signature-ed25519`` header: base64 of 64 bytes) is Telnyx's Ed25519
    signature of ``timestamp|body``, made with the account's key, and ``timestamp`` (``telnyx-timestamp``,
    Unix seconds) lies within ``tolerance`` of ``now`` (a replayed request is refused once it is older).

    The URL is not signed: a request's query is trusted once its body and timestamp are.
    """
    if signature is None or timestamp is None or not (timestamp.isascii() and timestamp.isdigit()):
        return False
    if abs(now - int(timestamp)) > tolerance:
        return False
    try:
        raw = base64.b64decode(signature, validate=True)
    except binascii.Error:
        return False
    if len(raw) != 64:
        return False
    try:
        key.verify(raw, timestamp.encode("ascii") + b"|" + body)
    except InvalidSignature:
        return False
    return True
