"""A bounded queue that never blocks its producer: when full, the oldest goes.

Real time beats completeness: a conversation that falls behind must catch up
by skipping stale audio, not by growing a backlog (and latency) forever.
Trio's memory channels apply backpressure instead, so the hops between a
session's receive / process / send tasks use this small class.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


class DropOldestChannel(Generic[T]):
    """Single-consumer FIFO of at most ``capacity`` droppable items (or, with ``weigh``, items weighing at
    most ``capacity`` in all: bytes, say).

    ``send_nowait(item)`` always succeeds.  If the queue is full, the oldest
    *droppable* items are discarded until the new one fits, and
    ``on_drop(name)`` is called for each, so every loss is counted.  Items
    sent with ``droppable=False`` (an Ogg stream's header pages, say) are
    never discarded and do not count against the capacity.

    ``receive()`` waits for an item; once :meth:`close` has been called and
    the queue is empty it raises :class:`trio.EndOfChannel`.

    ``salvage(dropped, successor)``, if given, may move what must not be lost
    (a text piece riding on an audio frame, say) onto the item that follows.
    ``drop_first(item)``, if given, picks what goes when the queue is full:
    the oldest droppable item it says yes to (silence, say), else the oldest.
    """

    def __init__(
        self,
        capacity: int,
        *,
        name: str,
        on_drop: Callable[[str], None] | None = None,
        salvage: Callable[[T, T], None] | None = None,
        drop_first: Callable[[T], bool] | None = None,
        weigh: Callable[[T], int] | None = None,
    ):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.name = name
        self.dropped = 0
        self._on_drop = on_drop
        self._salvage = salvage
        self._drop_first = drop_first
        self._weigh = weigh
        self._items: collections.deque[tuple[T, bool]] = collections.deque()
        self._weights: collections.deque[int] = collections.deque()  # each item's, in step with _items
        self._droppable = 0  # the weight of the droppable items waiting
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()

    def __len__(self) -> int:
        return len(self._items)

    def send_nowait(self, item: T, *, droppable: bool = True) -> None:
        """Queue ``item`` now, never blocking: droppable ones first make room by dropping the oldest droppable items;
        ``trio.ClosedResourceError`` once closed.
        """
        if self._closed:
            raise trio.ClosedResourceError(f"{self.name} channel is closed")
        weight = (self._weigh(item) if self._weigh is not None else 1) if droppable else 0
        while weight and self._droppable + weight > self.capacity and self._drop_oldest(item):
            pass
        self._items.append((item, droppable))
        self._weights.append(weight)
        self._droppable += weight
        self._lot.unpark()

    def _drop_oldest(self, incoming: T) -> bool:
        """Drop one droppable item (False: none is left)."""
        droppable = [index for index, (_, can_go) in enumerate(self._items) if can_go]
        if not droppable:
            return False
        first = self._drop_first
        index = next((i for i in droppable if first(self._items[i][0])), droppable[0]) if first else droppable[0]
        dropped, _ = self._items[index]
        del self._items[index]
        self._droppable -= self._weights[index]
        del self._weights[index]
        if self._salvage is not None:
            successor = self._items[index][0] if index < len(self._items) else incoming
            self._salvage(dropped, successor)
        self.dropped += 1
        if self._on_drop is not None:
            self._on_drop(self.name)
        return True

    def receive_nowait(self) -> T:
        """The oldest item; ``trio.WouldBlock`` if none is waiting, ``trio.EndOfChannel`` once closed and empty."""
        if not self._items:
            if self._closed:
                raise trio.EndOfChannel
            raise trio.WouldBlock
        item, _ = self._items.popleft()
        self._droppable -= self._weights.popleft()
        return item

    async def receive(self) -> T:
        """The oldest item, waiting for one; a cancelled call takes none (as Trio's own channels: the
        cancellation is checked before taking, and the yield after taking is shielded)."""
        parked = False
        while True:
            if not parked:  # a park was a checkpoint already: one yield per wait, not two
                await trio.lowlevel.checkpoint_if_cancelled()
            try:
                item = self.receive_nowait()
            except trio.WouldBlock:
                await self._lot.park()
                parked = True
            else:
                if not parked:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return item

    async def receive_batch(self) -> list[T]:
        """Wait for an item, then take it and everything queued behind it."""
        items = [await self.receive()]
        while self._items:
            items.append(self.receive_nowait())
        return items

    def close(self) -> None:
        """No more items will come; the receiver drains what is left."""
        self._closed = True
        self._lot.unpark_all()

    def __aiter__(self) -> DropOldestChannel[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
