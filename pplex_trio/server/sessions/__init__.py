"""The session core and its protocol adapters: one conversation's receive / process / send tasks over a
lease on the engine, and one adapter per wire protocol (Moshi, raw, Realtime, Live, the carriers; Realtime and
Live over WebRTC too)."""

from ._live import LiveOverWebRtc as LiveOverWebRtc
from ._live import LiveProtocol as LiveProtocol
from ._moshi import MoshiProtocol as MoshiProtocol
from ._raw import RawProtocol as RawProtocol
from ._realtime import SUBPROTOCOL as SUBPROTOCOL
from ._realtime import RealtimeOverWebRtc as RealtimeOverWebRtc
from ._realtime import RealtimeProtocol as RealtimeProtocol
from ._realtime import dialect_of as dialect_of
from ._session import Session as Session
from ._telephony import TelephonyProtocol as TelephonyProtocol
from ._transcript import NO_TRANSCRIBER as NO_TRANSCRIBER
