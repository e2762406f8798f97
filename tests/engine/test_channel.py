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


class _Steps(trio.abc.Instrument):
    """Counts the scheduler passes (task steps) of one task."""

    def __init__(self, task: trio.lowlevel.Task):
        self.task, self.steps = task, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += task is self.task


async def test_a_receive_that_waited_takes_one_scheduler_pass_to_return():
    # The park was the checkpoint: waking and returning the item is one step, not two.
    ch = DropOldestChannel(2, name="t")
    got = []

    async def consumer(task_status=trio.TASK_STATUS_IGNORED):
        task_status.started(trio.lowlevel.current_task())
        got.append(await ch.receive())
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        task = await nursery.start(consumer)
        await trio.testing.wait_all_tasks_blocked()
        steps = _Steps(task)
        trio.lowlevel.add_instrument(steps)
        ch.send_nowait("x")
        await trio.testing.wait_all_tasks_blocked()
        trio.lowlevel.remove_instrument(steps)
        assert got == ["x"] and steps.steps == 1
        nursery.cancel_scope.cancel()


async def test_a_receive_with_an_item_ready_is_still_a_checkpoint_and_a_cancelled_one_takes_nothing():
    ch = DropOldestChannel(2, name="t")
    ch.send_nowait("x")
    with trio.CancelScope() as scope:
        scope.cancel()
        await ch.receive()
    assert scope.cancelled_caught and len(ch) == 1  # cancelled before taking: nothing lost, nothing counted
    assert await ch.receive() == "x" and ch.dropped == 0


async def test_a_receive_with_an_item_ready_lets_other_tasks_run():
    ch = DropOldestChannel(2, name="t")
    ch.send_nowait("x")
    ran = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: ran.append(True) or trio.lowlevel.checkpoint())
        assert await ch.receive() == "x" and ran == [True]


async def test_a_receive_cancelled_while_waiting_leaves_the_next_item_for_the_next_receive():
    ch = DropOldestChannel(2, name="t")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ch.receive)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    ch.send_nowait("y")
    assert await ch.receive() == "y"
