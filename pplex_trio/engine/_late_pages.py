"""Telling a late page from a client that stopped sending.

A streaming live conversation with no frame at a tick is one of two things:
a page that came a little after the tick (jitter: the steering must widen its
margin and move the grid later, ``_phase``), or a client that stopped (the
end of its speech, a hang-up, a pause).  The second says nothing about
timing.  Counted as jitter, every conversation's end widened the margin by
2 ms and moved the grid 4 ms later for every conversation on it; the margin
shrinks by 1 ms only after 6 s without a miss, so a server with many short
conversations crept towards the 30 ms maximum (one server, one conversation
after another: 5, 6, 7, 8 ms...), and with it the handshake's lead.

So a tick's misses are judged at the next tick: a miss counts once the
conversation's next audio arrived after the tick that missed it, and
within a tick of it.  The steering reacts one tick later than it would have;
it moves a few milliseconds a tick anyway.
"""

from __future__ import annotations

from ._slots import Lease


class LatePages:
    """The misses of the previous tick that turned out to be late pages."""

    def __init__(self, tick_seconds: float):
        self._tick_seconds = tick_seconds
        self._missed: list[Lease] = []
        self._missed_at = 0.0

    def confirm(self, missed: list[Lease], now: float) -> int:
        """How many of the previous tick's misses were late pages; remember this tick's (``missed``, at ``now``)."""
        late = 0
        for lease in self._missed:
            arrived = lease.last_input_arrival
            if self._missed_at < arrived <= self._missed_at + self._tick_seconds:
                late += 1
        self._missed, self._missed_at = missed, now
        return late

    def forget(self) -> None:
        """The grid restarts after idling: nothing of the old one is judged."""
        self._missed = []
