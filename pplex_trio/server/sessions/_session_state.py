"""A session's own steps (:data:`SESSION_LIFECYCLE`) and why it ends (:class:`Ending`); see ``_session.py``."""

from __future__ import annotations

import dataclasses
import enum

from ..._conversation import CloseCode, Outcome
from ..._lifecycle import Lifecycle

# How a session may end and pause its conversation for a resume rather than end it: its client's connection
# went (None: a reset, a close frame with no end of the call before it: ASGI servers report both as 1006), it
# stopped reading, or another connection took the conversation over.
PAUSES = (None, Outcome.CLIENT_TIMEOUT, Outcome.TAKEN_OVER)


class SessionState(enum.Enum):
    """A session's own steps (its lease's, while it waits for a slot and for its prompt, are the lease's)."""

    ADMITTING = "admitting"  # accepted; reading and checking the conversation's settings, then waiting for its lease
    LIVE = "live"  # the handshake is sent: audio both ways
    CLOSING = "closing"  # telling the client why, closing the socket
    CLOSED = "closed"


# A client that vanishes ends it from any of them.
SESSION_LIFECYCLE = Lifecycle(
    "session",
    SessionState.ADMITTING,
    {
        SessionState.ADMITTING: {SessionState.LIVE, SessionState.CLOSING, SessionState.CLOSED},
        SessionState.LIVE: {SessionState.CLOSING, SessionState.CLOSED},
        SessionState.CLOSING: {SessionState.CLOSED},
        SessionState.CLOSED: set(),
    },
)


@dataclasses.dataclass(frozen=True)
class Ending:
    """Why a session ends, set once by the first :meth:`Session.end`: what the client is told, and the close."""

    code: CloseCode  # the outcome's, or the error's own (see ``Outcome.code``)
    message: str | None  # told to the client before the close, if any
    outcome: Outcome
