"""Where one web client's conversation stands, found by a ticket it chose.

The Moshi protocol has no "you are number n in the queue" message: while a
client waits it only gets pings.  Our web UI passes a random ``ticket`` in
the ``/api/chat`` query (servers ignore unknown parameters, so this breaks no
one) and polls ``GET /api/queue?ticket=…`` to show "queued (position n)" or
"preparing".  Nothing is sent on the WebSocket that an official client could
trip over.  A ticket is only a lookup key: knowing one reveals a queue
position, nothing more.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from typing import Any, Protocol

TICKET_PARAM = "ticket"
MAX_TICKET_CHARS = 128


class _Described(Protocol):
    ws: Any

    def describe(self) -> dict[str, Any]: ...


def ticket_of(session: _Described) -> str | None:
    """The ticket in a session's WebSocket query string, if any."""
    query = getattr(session.ws, "query_string", b"")
    if isinstance(query, bytes):
        query = query.decode("utf-8", errors="replace")
    values = urllib.parse.parse_qs(query).get(TICKET_PARAM)
    return values[-1] if values else None


def queue_status(sessions: Iterable[_Described], ticket: str, *, queued: int) -> dict[str, Any] | None:
    """``{"state", "position", "queued"}`` for the session holding ``ticket``, else None.

    ``state`` is the lease state (``negotiating``, ``queued``, ``prefill``,
    ``live``); ``position`` is 1-based while queued, else None; ``queued`` is
    how many conversations wait in all.
    """
    for session in sessions:
        if ticket_of(session) == ticket:
            described = session.describe()
            return {"state": described["state"], "position": described["queue_position"], "queued": queued}
    return None
