"""Early start: a tick need not wait for its deadline once every frame is in.

The tick grid is steered towards the moment the conversations' audio arrives
(``_phase``), but only a few milliseconds per tick and with a safety margin:
a conversation that has just started, or a grid that has just restarted,
waits most of a tick for a while, and even a settled grid keeps the margin.
Kyutai's reference server steps as soon as a frame is complete.

So within ``window`` before its deadline a tick starts as soon as every
*streaming* live conversation (one that sent audio lately) has its next
frame, and at least one live conversation has a frame at all.  Nobody's
frame can miss such a tick.  The deadlines themselves do not move, so the
engine still runs one tick per period on average: a client that floods
makes its ticks start ``window`` early, never more often.

The window is short (10 ms by default): it takes the steering's margin and
the jitter off each frame's wait, while the steering still decides where the
grid sits among conversations at different phases.  A long window would
decide that by itself, by whichever conversation's frame happens to complete
the set first, which can leave another's frame waiting most of a tick.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ._frame_watch import FrameWatch
from ._slots import Lease, SlotPhase, SlotTable


class EarlyStart:
    """Waits for the deadline, or until the tick's frames are all in within ``window`` of it."""

    def __init__(self, window: float, table: SlotTable, tick_seconds: float, frames: FrameWatch,
                 clock: Callable[[], float] = trio.current_time):
        self.window = window
        self._table = table
        self._tick_seconds = tick_seconds
        self._frames = frames
        self._clock = clock

    async def sleep_until(self, deadline: float) -> bool:
        """Sleep until ``deadline`` or an early start; True when the tick may start early."""
        if self.window <= 0:
            await trio.sleep_until(deadline)
            return False
        await trio.sleep_until(deadline - self.window)
        awaited, some_frame = self._waiting_for()
        await self._frames.wait(awaited, deadline, some_frame=some_frame)
        return self._clock() < deadline

    def _waiting_for(self) -> tuple[set[Lease], bool]:
        """The streaming live leases still short of a frame, and whether any live lease has one."""
        table, now = self._table, self._clock()
        awaited: set[Lease] = set()
        some_frame = False
        for slot in table.slots:
            lease = slot.lease
            if slot.phase is not SlotPhase.LIVE or lease is None:
                continue
            if table.has_input_frame(lease):
                some_frame = True
            elif table.still_streaming(slot, now, self._tick_seconds):
                awaited.add(lease)
        return awaited, some_frame
