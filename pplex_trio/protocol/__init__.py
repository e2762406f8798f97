"""Wire protocols, free of I/O: bytes in, events out (see ``docs/PROTOCOL.md``)."""

from . import _client_secrets as client_secrets
from . import _exotel as exotel
from . import _live as live
from . import _moshi as moshi
from . import _plivo as plivo
from . import _raw as raw
from . import _telephony as telephony
from . import _telnyx as telnyx
from . import _twilio as twilio
from ._access import (
    AUTH_TOKEN_ENV,
    TOKEN_PARAMETER,
    AccessPolicy,
    Allowed,
    Refused,
    RequestHead,
    parse_origins,
    query_without_token,
    same_secret,
)
from ._audio import Encoding, SampleFormat
from ._client_secrets import ClientSecret, ClientSecrets, parse_secret_request, session_settings
from ._errors import CloseCode, EventError, ProtocolError
from ._live_events import LiveEvents
from ._openai_events import AudioAppend, ClientEvent
from ._params import (
    SETTING_NAMES,
    conversation_from_params,
    parse_query,
    persona_text,
    temperature,
    voice_choice,
    voice_name,
)
from ._realtime import HANGUP as REALTIME_HANGUP
from ._realtime import (
    AudioFormat,
    Dialect,
    ItemEvent,
    ResponseCreate,
    SessionConfig,
    SessionUpdate,
    apply_session_update,
)
from ._realtime import parse_client_event as parse_realtime_event
from ._realtime_events import ServerEvents
from ._realtime_items import ConversationItems
from ._sdp import MAX_OFFER_BYTES, AudioOffer, CallOffer, check_offer
from ._ws_guard import InboundGuard, Refusal

__all__ = [
    # the Moshi and raw protocols' messages
    "moshi",
    "raw",
    # who may connect
    "AUTH_TOKEN_ENV",
    "TOKEN_PARAMETER",
    "AccessPolicy",
    "Allowed",
    "Refused",
    "RequestHead",
    "parse_origins",
    "query_without_token",
    "same_secret",
    "client_secrets",
    "ClientSecret",
    "ClientSecrets",
    "parse_secret_request",
    "session_settings",
    # a WebRTC call's SDP offer, checked
    "MAX_OFFER_BYTES",
    "AudioOffer",
    "CallOffer",
    "check_offer",
    # a conversation's settings, and what a bad one is told
    "CloseCode",
    "ProtocolError",
    "SETTING_NAMES",
    "conversation_from_params",
    "parse_query",
    "persona_text",
    "temperature",
    "voice_choice",
    "voice_name",
    # the audio a JSON protocol carries
    "Encoding",
    "SampleFormat",
    # the OpenAI Realtime protocol (its client events shared with Live's)
    "AudioAppend",
    "AudioFormat",
    "ClientEvent",
    "ConversationItems",
    "Dialect",
    "ItemEvent",
    "EventError",
    "ResponseCreate",
    "ServerEvents",
    "SessionConfig",
    "SessionUpdate",
    "apply_session_update",
    "parse_realtime_event",
    "REALTIME_HANGUP",
    # the OpenAI Live protocol (its client events in ``live``)
    "live",
    "LiveEvents",
    # phone carriers' media streams: the events common to all (``telephony``), each carrier's own
    "telephony",
    "twilio",
    "telnyx",
    "plivo",
    "exotel",
    # the inbound guard on a client's bytes
    "InboundGuard",
    "Refusal",
]
