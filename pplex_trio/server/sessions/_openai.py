"""What the two OpenAI protocols (Realtime, Live) share on the session core: refusals, notices and the end.

Both answer a client event they refuse with an ``error`` event naming it, and
tell the operator once per kind of refusal (:class:`~._wire.Notices`); audio
that cannot be decoded is refused the same way, its ``error`` going out with
the next frame, and heard as nothing; and the reason a session ends goes out
as an ``error`` event whose type says whose side it was on.  Their events
differ (``ServerEvents``, ``LiveEvents``), so the adapter hands its own.

Both resume a dropped call only for a client that asks, in the URL: ``?resumable=1``
gets a resume token (the session object's ``resume_token``), ``?resume=TOKEN``
resumes the call it names.  Neither protocol has a hang-up that every client sends
(Realtime has none at all), and a closed connection looks like a dropped one, so
a call of a client that never asked would hold its slot for the resume window after
every ordinary end (``docs/PROTOCOL.md``).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import numpy as np

from ..._conversation import CloseCode
from ...protocol import EventError, ProtocolError, parse_query
from ._audio_io import AudioIn
from ._wire import Message, Notices, OpensWithMessage, PendingEvents

SERVER_SIDE = frozenset({CloseCode.INTERNAL_ERROR, CloseCode.TRY_AGAIN_LATER, CloseCode.GOING_AWAY})


def error_type(code: int) -> str:
    """An OpenAI ``error`` event's type for an ending with close ``code``: the server's side, or the request's."""
    return "server_error" if code in SERVER_SIDE else "invalid_request_error"


class ErrorEvents(Protocol):
    """The part of an OpenAI protocol's server events that says something went wrong."""

    def error(self, message: str, *, kind: str = ..., code: str = ...) -> str:
        """An ``error`` event saying ``message`` (``kind``: whose side; ``code``: the OpenAI error code)."""

    def error_from(self, exc: EventError) -> str:
        """The ``error`` event for a client event the parser refused."""


Events = TypeVar("Events", bound=ErrorEvents)


class OpenAIProtocol(OpensWithMessage, Generic[Events]):
    """A protocol opened by a message whose refusals are ``error`` events (made by ``events``, the protocol's
    server events): an adapter refuses with :meth:`_refuse`; the events it has to send before the next frame's
    audio wait in ``_pending`` (its ``encode`` sends them first)."""

    def __init__(self, events: Events) -> None:
        self.events = events
        self.notices = Notices()
        self._pending = PendingEvents()

    def _refuse(self, exc: EventError) -> Message:
        """The ``error`` event that answers a refused client event (the operator hears of it once per kind)."""
        self.notices.refused(exc)
        return self.events.error_from(exc)

    def _resume_asked(self, query: bytes) -> str | None:
        """What the URL asks of resuming: ``?resumable=1`` makes this connection resumable; ``?resume=TOKEN`` too,
        and names the paused call it resumes (returned)."""
        params = parse_query(query)
        token = params.get("resume")
        if token is not None and not token:
            raise ProtocolError("?resume= must be the resume_token a session gave", CloseCode.POLICY)
        self.resumable = token is not None or params.get("resumable") in ("1", "true")
        return token

    def take_notices(self) -> list[str]:
        return self.notices.take()

    def _heard(self, audio_in: AudioIn, data: bytes) -> np.ndarray:
        """Appended ``data`` as the model's PCM; audio that cannot be decoded is refused (with the next frame)
        and heard as nothing."""
        try:
            return audio_in(data)
        except EventError as exc:
            self._pending.add(self._refuse(exc))
            return np.zeros(0, dtype=np.float32)

    def error(self, message: str, code: int) -> Message:
        return self.events.error(message, kind=error_type(code), code=f"close_{int(code)}")
