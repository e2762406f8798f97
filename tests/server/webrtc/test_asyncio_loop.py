"""The asyncio loop thread a Trio task owns (issue 49 §4): results and exceptions come back, a Trio cancel reaches
the asyncio task, and leaving the block leaves no thread and no open loop behind.

The asyncio side runs on real threads and its own clock, so these tests use real time, kept short.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
import trio

from pplex_trio.server.webrtc import AsyncioLoop, open_asyncio_loop


def _loop_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("test-asyncio")]


async def test_a_coroutine_result_comes_back_to_trio_from_the_loop_thread():
    async def where(x):
        await asyncio.sleep(0)
        return x * 2, threading.current_thread().name, asyncio.get_running_loop().is_running()

    async with open_asyncio_loop(name="test-asyncio-result") as loop:
        doubled, thread_name, running = await loop.run(where, 21)
    assert (doubled, thread_name, running) == (42, "test-asyncio-result", True)
    assert thread_name != threading.current_thread().name


async def test_a_coroutine_exception_is_raised_in_trio_as_itself():
    class Boom(Exception):
        pass

    async def fails():
        await asyncio.sleep(0)
        raise Boom("from asyncio")

    async with open_asyncio_loop(name="test-asyncio-error") as loop:
        with pytest.raises(Boom, match="from asyncio"):
            await loop.run(fails)
        # the loop goes on serving after a failure
        assert await loop.run(asyncio.sleep, 0, "still") == "still"


async def test_a_trio_cancel_cancels_the_asyncio_task_and_waits_for_its_cleanup():
    seen: list[str] = []
    started = trio.Event()
    token = trio.lowlevel.current_trio_token()

    async def waits_forever():
        token.run_sync_soon(started.set)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # cleanup that takes a while: Trio must wait for it
            seen.append("cancelled")
            raise

    async with open_asyncio_loop(name="test-asyncio-cancel") as loop:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(loop.run, waits_forever)
                await started.wait()
                scope.cancel()
        assert scope.cancelled_caught
        assert seen == ["cancelled"]  # the asyncio side finished its cleanup before Trio unwound


async def test_leaving_the_block_cancels_pending_tasks_and_leaves_no_thread_or_open_loop():
    cancelled = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    async def left_behind():
        loops.append(asyncio.get_running_loop())
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with open_asyncio_loop(name="test-asyncio-exit") as loop:
        assert len(_loop_threads()) == 1
        # a task the owner never awaits: started on the loop directly, the way a stack's own callbacks start them
        await loop.run(_spawn, left_behind)
    assert cancelled.is_set()
    assert _loop_threads() == []
    assert loops[0].is_closed()


async def _spawn(coro_fn):
    asyncio.get_running_loop().create_task(coro_fn())
    await asyncio.sleep(0)


async def test_a_coroutine_that_ignores_its_cancel_is_waited_for_only_the_grace(caplog):
    grace = 0.2
    started = trio.Event()
    token = trio.lowlevel.current_trio_token()

    async def stubborn():
        token.run_sync_soon(started.set)
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # ignores every cancel

    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pplex_trio.server.webrtc._asyncio_loop"):
        async with open_asyncio_loop(name="test-asyncio-stubborn", cancel_grace=grace) as loop:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(loop.run, stubborn)
                    await started.wait()
                    scope.cancel()
            unwound = time.monotonic() - began
    closed = time.monotonic() - began
    # run unwound after one grace; the exit waited one more, then closed the loop anyway
    assert grace <= unwound < grace + 1.0
    assert 2 * grace <= closed < 2 * grace + 1.5
    assert _loop_threads() == []
    assert "ignored their cancel" in caplog.text


async def test_run_after_the_block_is_refused():
    async with open_asyncio_loop(name="test-asyncio-after") as loop:
        assert isinstance(loop, AsyncioLoop)
    with pytest.raises(RuntimeError):
        await loop.run(asyncio.sleep, 0)
    assert _loop_threads() == []
