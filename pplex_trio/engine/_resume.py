"""Resume tokens: a conversation whose connection dropped waits, paused, for its client to come back.

A row that is not stepped keeps its whole state (its KV cache, Mimi's state,
its sampling), so a conversation paused and resumed goes on exactly as if the
outage's frames had never existed.  A session that can resume (its protocol
delivers the token) asks :meth:`ResumeBook.issue` for a token for its lease;
when its connection drops without the call ending, :meth:`Lease.pause` parks
the lease here under that token for ``resume_seconds`` (its slot counts as
held); a new connection presenting the token takes the lease over
(:meth:`ResumeBook.resume`) and gets a new token.  A window that lapses gives
the lease back as an ended one would be (its slot drains, then is free).

**Tokens.**  ``secrets.token_urlsafe(24)``: 192 random bits, unguessable.
Each is usable once (a resume spends it; the resumed session is issued a new
one) and names one lease.  They are bound to no principal: the server's
clients share one access token (``protocol/_access.py``), which the resuming
connection must present like any other.  A token presented while its lease's
connection is still alive takes the conversation over: the old session is told
(its ``on_taken``) and ends, pausing the lease, which the new one then takes.

**What is parked beside the lease.**  A token is issued with a :class:`Parked`
of the session's, opaque here: the conversation's observer (what the server
reports of the call: its quality meter, its record), which outlives the
connection.  It observes the conversation's frames, goes to whoever resumes it,
and is told once, :meth:`Parked.lapsed`, when a paused conversation will never
be resumed (its window lapsed, the server ended it while paused, the server
stops).  So one conversation has one observer across its resumes, and exactly
one of three finishes it: the session holding it when the call ends, the
session that resumed it, or its lapse.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
from collections.abc import Callable
from typing import Protocol

import trio

from .._metrics import Metrics
from ._lease import Lease
from ._lease_core import GONE_STATES, PAUSABLE_STATES, LeaseState, LeaseView
from ._outbox import OutputFrame

logger = logging.getLogger(__name__)

TAKE_OVER_SECONDS = 5.0  # how long a resume waits for the connection it takes the conversation from to let go


class ResumeRefused(Exception):
    """A resume that cannot be: ``outcome`` (``wrong_token``, ``refused``) for the metrics, the message for the
    client (closed with 1008)."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome
        self.message = message


class Parked(Protocol):
    """What a session parks with its conversation's token (the engine knows it by these two alone)."""

    def on_frame(self, frame: OutputFrame) -> None:
        """Observe one of the conversation's frames (see :class:`~._engine_lease.EngineLease`), after a resume too."""

    def lapsed(self) -> None:
        """The paused conversation will never be resumed (told once, on the actor's task): finish what it
        reports."""


@dataclasses.dataclass
class _Ticket:
    lease: Lease  # the session's end it was issued to (paused: parked here)
    keep: Parked  # the session's: goes to whoever resumes it
    on_taken: Callable[[], None]  # tells that session a new connection takes its conversation over
    until: float = math.inf  # paused: when its window lapses
    claimed: bool = False  # a resume waits for the old connection to let go


class ResumeBook:
    """The tokens issued, and the paused leases parked under them (one per token), on the actor's clock."""

    def __init__(self, seconds: float, clock: Callable[[], float], metrics: Metrics):
        self.seconds = seconds  # ``--resume-seconds`` (0: off, a dropped connection ends its conversation)
        self._clock = clock
        self._metrics = metrics
        self._tickets: dict[str, _Ticket] = {}

    @property
    def enabled(self) -> bool:
        """Whether a dropped connection pauses its conversation (``--resume-seconds`` above 0)."""
        return self.seconds > 0

    def issue(self, lease: Lease, on_taken: Callable[[], None], *, keep: Parked) -> str | None:
        """A new token for ``lease`` (its older ones are spent), None when resuming is off; ``on_taken`` is told
        when another connection presents it while this one is alive; ``keep`` goes to whoever resumes it."""
        if not self.enabled:
            return None
        self._forget(lease)
        token = secrets.token_urlsafe(24)
        self._tickets[token] = _Ticket(lease, keep, on_taken)
        return token

    def park(self, lease: LeaseView) -> float | None:
        """``lease``'s connection dropped: until when it waits (None: it has no token, so it ends)."""
        for ticket in self._tickets.values():
            if ticket.lease is lease:
                ticket.until = self._clock() + self.seconds
                return ticket.until
        return None

    def discard(self, lease: Lease) -> None:
        """``lease`` ended: its token is spent."""
        self._forget(lease)

    async def resume(self, token: str) -> tuple[Lease, Parked]:
        """The conversation ``token`` names, taken over by the caller (a new end of its lease, stepped again,
        observed by what was parked with it), and what was parked with it.

        A conversation whose connection is still alive is taken from it
        (that session is told, ends and lets go within
        :data:`TAKE_OVER_SECONDS`).  Error handling: :class:`ResumeRefused`
        for a token that names nothing (unknown, spent, lapsed: ``wrong_token``)
        or a conversation that cannot go on (the server ended it: ``refused``).
        """
        ticket = self._tickets.get(token)
        if ticket is None or ticket.claimed or ticket.lease.state in GONE_STATES or self._clock() >= ticket.until:
            raise self._refused("wrong_token", "this resume token is unknown, used or expired: start a new call")
        ticket.claimed = True
        lease = ticket.lease
        if lease.state in PAUSABLE_STATES:
            ticket.on_taken()
            with trio.move_on_after(TAKE_OVER_SECONDS):
                while lease.state in PAUSABLE_STATES:
                    await lease.wait_changed()
        del self._tickets[token]
        if lease.state is not LeaseState.PAUSED:
            if ticket.until < math.inf:  # a paused one the server ended meanwhile (else its session ends it)
                self._give_back(ticket)
            raise self._refused("refused", "this conversation cannot be resumed (it has ended): start a new call")
        self._metrics.resumes.labels("resumed").inc()
        return lease.resume(ticket.keep.on_frame), ticket.keep

    def lapse_due(self) -> None:
        """Give back the paused leases whose window has lapsed, or that the server ended meanwhile; forget the
        tokens of leases that ended."""
        now = self._clock()
        for token, ticket in list(self._tickets.items()):
            lease = ticket.lease
            parked = ticket.until < math.inf  # (then nobody else gives it back)
            if ticket.claimed or (not parked and lease.state not in GONE_STATES):
                continue
            if lease.state is LeaseState.PAUSED and now < ticket.until:
                continue
            del self._tickets[token]
            if parked:
                if lease.state is LeaseState.PAUSED:
                    self._metrics.resumes.labels("expired").inc()
                self._give_back(ticket)

    def lapse_all(self) -> None:
        """The server stops: every paused conversation is given back now (nobody can resume it any more)."""
        for token, ticket in list(self._tickets.items()):
            if ticket.until < math.inf and not ticket.claimed:
                del self._tickets[token]
                self._give_back(ticket)

    def next_lapse(self) -> float:
        """When the next paused lease's window lapses (inf: none is paused)."""
        return min((t.until for t in self._tickets.values() if t.lease.state is LeaseState.PAUSED), default=math.inf)

    @staticmethod
    def _give_back(ticket: _Ticket) -> None:
        """A parked conversation nobody resumes: its slot drains, and what was parked with it finishes."""
        ticket.lease.lapse()
        try:
            ticket.keep.lapsed()
        except Exception:  # (the session's bug: never the actor's)
            logger.exception("slot %s: finishing a conversation whose resume window lapsed failed", ticket.lease.slot)

    def _forget(self, lease: Lease) -> None:
        for token in [token for token, ticket in self._tickets.items() if ticket.lease is lease]:
            del self._tickets[token]

    def _refused(self, outcome: str, message: str) -> ResumeRefused:
        self._metrics.resumes.labels(outcome).inc()
        return ResumeRefused(outcome, message)
