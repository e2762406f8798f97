"""Steering the tick grid towards the moment the conversations' audio arrives.

The framer (``_framing``) cuts each conversation's stream so that a frame
ends at its newest audio; what is left is the wait between that audio's
arrival and the tick.  Clients that start streaming when they get the
handshake all send at nearly the same phase, so the whole grid can move so
that ticks fall just after their pages arrive.  :class:`PhaseSteering`
decides how far, tick by tick, from the slacks and the late pages the
:class:`~pplex_trio.engine._schedule.TickSchedule` (its owner) gives it.
"""

from __future__ import annotations

import collections


class PhaseSteering:
    """Per tick: slacks in, how far to move the next deadline (negative = earlier).

    Moving a tick earlier by ``d`` keeps every frame complete as long as
    ``d`` is less than every live conversation's *slack* (tick time minus
    the arrival of the last sample of the frame it takes).  So the grid moves
    earlier by a fraction of the smallest slack of the last ``window`` ticks
    (as it would be on today's grid) beyond a safety *margin*, and later
    whenever a streaming conversation finds no frame.  Each such miss widens
    the margin; calm stretches narrow it again, slowly.  With clients at
    random phases the smallest slack is near zero and the grid stays put.

    A miss costs the caller a tick of lag, mostly for good; a move earlier
    gains a few milliseconds.  So the window is long (10 s: a client's
    rhythm and a jittery network's late pages come round in it), and after a
    miss the grid moves earlier only once a whole window has been seen again.
    ``window`` and ``calm_ticks`` are counted in ticks: the schedule turns
    its settings' seconds (``steering_window``, ``steering_calm``) into them.
    Measured, 100 ms messages each 0-20 ms late: 6 silent frames a minute
    with a 2 s window and no wait, 1 to 3 with both (16 seeded minutes).
    """

    def __init__(
        self,
        *,
        window: int,
        calm_ticks: int,
        margin: float = 0.003,
        max_margin: float = 0.030,
        gain: float = 0.25,
        max_step: float = 0.005,
        late_step: float = 0.004,
    ):
        self.min_margin = self.margin = margin
        self.max_margin = max_margin
        self.gain = gain
        self.max_step = max_step
        self.late_step = late_step
        self.calm_ticks = calm_ticks
        self.window = window
        self._calm = 0
        self.moved = 0.0
        # Each recent tick's smallest slack, as ``slack - moved``: adding today's ``moved`` gives it on today's grid.
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._relearning = False  # a miss: no move earlier until the window is whole again

    def forget(self) -> None:
        """The grid restarts: slacks measured on the old one mean nothing now."""
        self._recent.clear()
        self._calm = 0
        self._relearning = False

    def adjust(self, slacks: list[float], late: int) -> float:
        """``slacks`` of the conversations that got a frame, ``late`` how many streaming ones got none."""
        if late:
            self.margin = min(self.max_margin, self.margin + 0.002)
            self._calm = 0
            self._recent.clear()
            self._relearning = True
            step = self.late_step
        else:
            self._calm += 1
            if self._calm >= self.calm_ticks:  # calm for a while (6 s): trust the timing a little more
                self.margin = max(self.min_margin, self.margin - 0.001)
                self._calm = 0
            if slacks:
                self._recent.append(min(slacks) - self.moved)
            self._relearning = self._relearning and len(self._recent) < self.window
            spare = min(self._recent) + self.moved - self.margin if self._recent and not self._relearning else 0.0
            step = -min(self.max_step, self.gain * spare) if spare > 0 else 0.0
        self.moved += step
        return step
