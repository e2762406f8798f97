"""The error every protocol codec raises for bad client input."""

from __future__ import annotations

from .._conversation import CloseCode

__all__ = ["CloseCode", "ProtocolError"]


class ProtocolError(Exception):
    """Bad input from a client: tell it ``message``, then close with ``code``."""

    def __init__(self, message: str, code: int = CloseCode.POLICY):
        super().__init__(message)
        self.message = message
        self.code = code
