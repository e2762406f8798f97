"""The HTTP/WebSocket server: routes, sessions, and how it runs."""

from ._app import create_app as create_app
from ._serve import ServerHandle as ServerHandle
from ._serve import serve as serve
from ._settings import ServerSettings as ServerSettings
from ._state import ServerState as ServerState
