"""The error every protocol codec raises for bad client input."""

from __future__ import annotations


class CloseCode:
    """WebSocket close codes the server uses (RFC 6455, section 7.4)."""

    NORMAL = 1000
    GOING_AWAY = 1001  # server shutting down
    UNSUPPORTED_DATA = 1003  # e.g. a text frame where only binary is spoken
    INVALID_PAYLOAD = 1007  # bad UTF-8 / JSON / Opus / PCM
    POLICY = 1008  # bad query parameter, prompt, voice
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # every slot busy, queue full or wait timed out


class ProtocolError(Exception):
    """Bad input from a client: tell it ``message``, then close with ``code``."""

    def __init__(self, message: str, code: int = CloseCode.POLICY):
        super().__init__(message)
        self.message = message
        self.code = code
