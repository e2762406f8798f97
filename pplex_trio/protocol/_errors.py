"""The error every protocol codec raises for bad client input."""

from __future__ import annotations

from .._conversation import CloseCode

__all__ = ["CloseCode", "ProtocolError"]


class ProtocolError(Exception):
    """Bad input from a client: tell it ``message``, then close with ``code``.

    ``param`` names the bad setting and ``kind`` says what is wrong with it
    (``invalid_value``, ``string_above_max_length``), for the protocols whose
    errors carry them (OpenAI Realtime).
    """

    def __init__(self, message: str, code: CloseCode = CloseCode.POLICY, *, param: str | None = None,
                 kind: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.kind = kind
