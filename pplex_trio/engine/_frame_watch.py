"""Waiting, within a tick, until certain conversations' next frames are in.

The input grace (a tick held a few ms past its deadline for a page that is
due) and the early start (a tick started before its deadline once every frame
is in) both wait this way, never at the same time: a set of leases, woken by
each push, until each of them has a whole frame or time is up.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from ._slots import Lease


class FrameWatch:
    """``await wait(leases, until)``; every push calls :meth:`input_arrived`."""

    def __init__(self, has_frame: Callable[[Lease], bool]):
        self._has_frame = has_frame
        self._awaited: set[Lease] | None = None  # None: nobody waits
        self._some_frame = False
        self._done = trio.Event()

    async def wait(self, awaited: set[Lease], until: float, *, some_frame: bool = True) -> None:
        """Until every lease in ``awaited`` has a frame, or ``until``.

        ``some_frame=False``: no lease has a frame yet, and the wait also lasts
        until one has (an empty ``awaited`` alone is not enough then).
        """
        self._awaited, self._some_frame = awaited, some_frame
        self._done = trio.Event()
        try:
            if awaited or not some_frame:
                with trio.move_on_at(until):
                    await self._done.wait()
        finally:
            self._awaited = None

    def input_arrived(self, lease: Lease) -> None:
        """A push: it may have completed a frame that is waited for."""
        awaited = self._awaited
        if awaited is None or not self._has_frame(lease):
            return
        self._some_frame = True
        awaited.discard(lease)
        if not awaited:
            self._done.set()
