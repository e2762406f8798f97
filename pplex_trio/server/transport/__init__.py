"""The HTTP transport: sockets, TLS, the access gate, the access log, the conversations' ASGI WebSocket,
the official client's files and the queue's status; nothing here knows a conversation's session."""

from ._access_log import AccessLog as AccessLog
from ._asgi_websocket import AsgiWebSocket as AsgiWebSocket
from ._asgi_websocket import ConversationRouter as ConversationRouter
from ._gate import GRANT_KEY as GRANT_KEY
from ._gate import AccessGate as AccessGate
from ._official import ROOT_QUERY as ROOT_QUERY
from ._official import find_official_client as find_official_client
from ._official import official_index as official_index
from ._queue_status import MAX_TICKET_CHARS as MAX_TICKET_CHARS
from ._queue_status import queue_status as queue_status
from ._tls import Certificate as Certificate
from ._tls import prepare_certificate as prepare_certificate
from ._transport import serve_http as serve_http
