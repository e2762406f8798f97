"""The HTTP/WebSocket server: routes, sessions, and how it runs."""

from ._app import create_app as create_app
from ._context import ServerContext as ServerContext
from ._serve import ListenError as ListenError
from ._serve import ServerHandle as ServerHandle
from ._serve import bind_sockets as bind_sockets
from ._serve import serve as serve
from ._serve import socket_listeners as socket_listeners
from ._serve import tls_certificate as tls_certificate
from ._settings import ServerSettings as ServerSettings
from .records import RecordFolderError as RecordFolderError
from .records import prepare_record_folder as prepare_record_folder
