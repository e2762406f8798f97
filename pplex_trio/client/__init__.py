"""A command-line client that streams a wav file through a running server."""

from ._call import CallFailed as CallFailed
from ._call import ClientError as ClientError
from ._call import ClientResult as ClientResult
from ._client import conversation_url as conversation_url
from ._client import read_wav as read_wav
from ._client import run_client as run_client
from ._client import stream_moshi as stream_moshi
from ._client import stream_raw as stream_raw
from ._realtime_call import stream_realtime as stream_realtime
from ._resume import RECONNECT_SECONDS as RECONNECT_SECONDS
from ._voices import VoiceApiError as VoiceApiError
from ._voices import add_voice as add_voice
from ._voices import list_voices as list_voices
from ._voices import remove_voice as remove_voice
from ._ws import Refused as Refused
from ._ws import client_ssl_context as client_ssl_context
from ._ws import open_websocket as open_websocket
