"""The error every protocol codec raises for bad client input."""

from __future__ import annotations

from .._conversation import CloseCode

__all__ = ["CloseCode", "ProtocolError", "EventError"]


class ProtocolError(Exception):
    """Bad input from a client: tell it ``message``, then close with ``code``.

    ``param`` names the bad setting and ``kind`` says what is wrong with it
    (``invalid_value``, ``string_above_max_length``), for the protocols whose
    errors carry them (OpenAI Realtime).
    """

    def __init__(
        self, message: str, code: CloseCode = CloseCode.POLICY, *, param: str | None = None, kind: str = "invalid_value"
    ):
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.kind = kind


class EventError(Exception):
    """A client event the server cannot take (OpenAI Realtime, Live): answered with an ``error`` event that
    names it (``event_id``, the client's); the session goes on."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str = "invalid_value",
        event_id: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.event_id = event_id
        self.kind = kind
