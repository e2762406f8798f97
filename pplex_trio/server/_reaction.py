"""How long clients take from our handshake to their first page, beyond its audio.

The handshake goes out just ahead of a tick so that a client which starts
streaming when it gets it (the official client does) sends its pages at a
phase that lands them a safety margin before the ticks.  For that the server
must know how long the client takes to react: the way out, the client's
start-up, the way back.  It differs between a browser on a phone and a
program on the same machine, so it is measured on every aligned
conversation's first page and the median of recent ones is used.
"""

from __future__ import annotations

import collections
import statistics

DEFAULT_REACTION = 0.003
MAX_REACTION = 0.020  # beyond this the "reaction" is a client that did not start at the handshake


class ClientReaction:
    """The median reaction of the last ``window`` clients (``DEFAULT_REACTION`` before any)."""

    def __init__(self, window: int = 15):
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self.estimate = DEFAULT_REACTION

    def observe(self, handshake_sent: float, first_page_arrived: float, page_seconds: float) -> None:
        """A client's first page after the handshake: it began recording when the handshake reached it."""
        reaction = first_page_arrived - handshake_sent - page_seconds
        self._recent.append(min(max(reaction, 0.0), MAX_REACTION))
        self.estimate = statistics.median(self._recent)
