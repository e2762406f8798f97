"""Input grace: a tick may wait a few milliseconds for a page that is due.

A phase-aligned conversation's page lands a safety margin before the tick
that takes it.  When jitter makes it a little late, the frame would miss its
tick: the model hears a silent frame, and the stream carries a frame of extra
delay until the framer catches up.  So a tick whose aligned conversation is
short of exactly its next page waits for that page, up to ``grace`` (4 ms by
default), a few times per second at most: jitter costs the others a few
milliseconds now and then instead of costing one conversation 80 ms, and the
steering margin can stay small.
"""

from __future__ import annotations

import collections

from ._frame_watch import FrameWatch
from ._slots import Lease

GRACE_WINDOW = 25  # ticks (2 s) ...
GRACE_PER_WINDOW = 3  # ... in which at most this many may be held


class InputGrace:
    """Holds a tick until the awaited conversations' pages arrive, or the grace runs out."""

    def __init__(self, grace: float, frames: FrameWatch):
        self.grace = grace
        self._frames = frames
        self._held: collections.deque[int] = collections.deque()  # recent ticks that were held

    def allowed(self, tick: int, now: float, deadline: float) -> bool:
        """Whether tick ``tick`` may still be held (grace left, and not held too often lately)."""
        while self._held and self._held[0] <= tick - GRACE_WINDOW:
            self._held.popleft()
        return now < deadline + self.grace and len(self._held) < GRACE_PER_WINDOW

    async def hold(self, tick: int, awaited: list[Lease], deadline: float) -> None:
        """Wait until every lease in ``awaited`` has a whole frame, or ``grace`` past ``deadline``."""
        self._held.append(tick)
        await self._frames.wait(set(awaited), deadline + self.grace)
