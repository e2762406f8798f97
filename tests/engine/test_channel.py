"""DropOldestChannel: never blocks the producer, drops (and counts) the oldest."""

import pytest
import trio
import trio.testing

from pplex_trio._channel import DropOldestChannel


async def test_fifo_within_capacity():
    ch = DropOldestChannel(3, name="t")
    for i in range(3):
        ch.send_nowait(i)
    assert [await ch.receive() for _ in range(3)] == [0, 1, 2]
    assert ch.dropped == 0


async def test_overflow_drops_oldest_and_reports():
    drops = []
    ch = DropOldestChannel(2, name="out", on_drop=drops.append)
    for i in range(5):
        ch.send_nowait(i)
    assert [ch.receive_nowait(), ch.receive_nowait()] == [3, 4]
    assert ch.dropped == 3 and drops == ["out"] * 3


async def test_undroppable_items_survive_and_keep_their_place():
    ch = DropOldestChannel(2, name="t")
    ch.send_nowait("header", droppable=False)
    for i in range(4):
        ch.send_nowait(i)
    assert [ch.receive_nowait() for _ in range(3)] == ["header", 2, 3]


async def test_receive_waits_for_a_sender():
    ch = DropOldestChannel(1, name="t")
    got = []

    async def consumer():
        got.append(await ch.receive())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        ch.send_nowait("x")
    assert got == ["x"]


async def test_close_lets_the_receiver_drain_then_end():
    ch = DropOldestChannel(4, name="t")
    ch.send_nowait(1)
    ch.send_nowait(2)
    ch.close()
    assert [item async for item in ch] == [1, 2]
    with pytest.raises(trio.EndOfChannel):
        await ch.receive()
    with pytest.raises(trio.ClosedResourceError):
        ch.send_nowait(3)


async def test_close_wakes_a_waiting_receiver():
    ch = DropOldestChannel(1, name="t")
    async with trio.open_nursery() as nursery:
        async def consumer():
            with pytest.raises(trio.EndOfChannel):
                await ch.receive()
        nursery.start_soon(consumer)
        await trio.testing.wait_all_tasks_blocked()
        ch.close()


async def test_salvage_moves_what_must_survive_to_the_next_item():
    merged = []
    ch = DropOldestChannel(2, name="t", salvage=lambda dropped, successor: merged.append((dropped, successor)))
    for item in ("a", "b", "c", "d"):
        ch.send_nowait(item)
    assert merged == [("a", "b"), ("b", "c")]
