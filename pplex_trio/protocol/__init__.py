"""Wire protocols, free of I/O: bytes in, events out (see ``docs/PROTOCOL.md``)."""

from . import _moshi as moshi
from . import _ogg as ogg
from . import _raw as raw
from ._access import AccessPolicy as AccessPolicy
from ._access import Allowed as Allowed
from ._access import Refused as Refused
from ._access import RequestHead as RequestHead
from ._access import parse_origins as parse_origins
from ._errors import CloseCode as CloseCode
from ._errors import ProtocolError as ProtocolError
from ._params import conversation_from_params as conversation_from_params
from ._params import parse_query as parse_query
from ._params import persona_text as persona_text
from ._params import temperature as temperature
from ._params import voice_name as voice_name

__all__ = ["AccessPolicy", "Allowed", "Refused", "RequestHead", "parse_origins", "moshi", "ogg", "raw", "CloseCode", "ProtocolError", "conversation_from_params", "parse_query",
           "persona_text", "temperature", "voice_name"]
