"""One asyncio event loop on its own thread, owned by a Trio task: the home of the WebRTC stack (aiortc runs on
asyncio) under the Trio server's structured concurrency.

``open_asyncio_loop()`` starts the thread and yields an ``AsyncioLoop``; ``await loop.run(coro_fn, *args)`` runs a
coroutine there and hands its result or exception back to Trio. A Trio cancel cancels the asyncio task and waits
for it to finish. Leaving the block cancels whatever is still running, closes the loop and joins the thread, so
neither outlives its owner.

The bound: a coroutine that ignores its cancellation (catches ``CancelledError`` and goes on) is waited for at most
``cancel_grace`` seconds, on the asyncio loop's own clock; ``run`` then unwinds and leaves it behind, and the exit
waits the same grace once more before it stops and closes the loop regardless, logging what it abandoned. Code that
blocks the loop's thread (a synchronous call that never returns) cannot be bounded: nothing stops a thread.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

__all__ = ["AsyncioLoop", "open_asyncio_loop", "CANCEL_GRACE_SECONDS"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a cancelled asyncio task may take to finish before Trio stops waiting for it (see the module's doc).
CANCEL_GRACE_SECONDS = 5.0


class AsyncioLoop:
    """The asyncio loop thread ``open_asyncio_loop`` owns; ``run`` is the one way in from Trio."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel_grace: float, token: trio.lowlevel.TrioToken) -> None:
        self._loop = loop
        self._token = token
        self._to_trio: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []  # (the loop's thread's alone)
        self._cancel_grace = cancel_grace
        self._closing = False
        self._calls: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._woken = False  # a drain of ``_calls`` is due on the loop

    async def run(self, coro_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``coro_fn(*args)`` as a task on the asyncio loop and return its result (or raise its exception).

        A Trio cancel cancels the task and waits until it has finished, or ``cancel_grace`` seconds of the loop's
        clock when it ignores the cancel; then the ``Cancelled`` goes on. A task the loop cancelled itself (its
        owner is closing it) raises ``RuntimeError``.
        """
        if self._closing:
            raise RuntimeError("the asyncio loop is closing")
        token = trio.lowlevel.current_trio_token()
        settled = trio.Event()
        box: dict[str, Any] = {}

        def settle() -> None:
            # Either the task's end or the grace's; only the first counts.
            if "settled" not in box:
                box["settled"] = True
                token.run_sync_soon(settled.set)

        def start() -> None:
            try:
                task = self._loop.create_task(_awaited(coro_fn, args))
            except BaseException as exc:  # not a coroutine function: say so on the Trio side
                box["error"] = exc
                settle()
                return
            box["task"] = task
            task.add_done_callback(lambda _: settle())

        def cancel() -> None:
            task = box.get("task")
            if task is not None and not task.done():
                task.cancel()
                self._loop.call_later(self._cancel_grace, settle)

        self._loop.call_soon_threadsafe(start)
        try:
            await settled.wait()
        except trio.Cancelled:
            self._loop.call_soon_threadsafe(cancel)
            with trio.CancelScope(shield=True):
                await settled.wait()
            raise
        if "error" in box:
            raise box["error"]
        task = box["task"]
        if task.cancelled():
            raise RuntimeError("the asyncio task was cancelled by its loop's owner")
        return task.result()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` on the asyncio loop's thread, in order, without waiting for it (nothing, once it is
        closing). The calls made before the loop gets to them run together, at one wakeup of its thread (an
        engine tick's frames for every call, one wakeup)."""
        if self._closing:
            return
        self._calls.append((fn, args))
        if not self._woken:
            self._woken = True
            self._loop.call_soon_threadsafe(self._drain)

    def to_trio(self, fn: Callable[..., Any], *args: Any) -> None:
        """On the loop's thread: call ``fn(*args)`` on Trio's, in order, without waiting for it (nothing, once Trio
        is gone). Those handed in one turn of the loop go together, at one wakeup of Trio's thread."""
        if not self._to_trio:
            self._loop.call_soon(self._hand_over)
        self._to_trio.append((fn, args))

    def _hand_over(self) -> None:
        calls, self._to_trio = self._to_trio, []
        try:
            self._token.run_sync_soon(_call_all, calls)
        except trio.RunFinishedError:  # (the server is gone: nobody to tell)
            pass

    def _drain(self) -> None:
        self._woken = False  # (before taking them: a call made meanwhile either is taken here or wakes anew)
        while self._calls:
            fn, args = self._calls.popleft()
            try:
                fn(*args)
            except Exception:  # (as the loop's own callbacks: logged, the others still run)
                log.exception("a call handed to the asyncio loop failed")


def _call_all(calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    for fn, args in calls:
        try:
            fn(*args)
        except Exception:  # (Trio's run would end on it: logged, the others still run)
            log.exception("a call handed to Trio failed")


async def _awaited(coro_fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
    return await coro_fn(*args)


@asynccontextmanager
async def open_asyncio_loop(
    *, cancel_grace: float = CANCEL_GRACE_SECONDS, name: str = "asyncio-loop"
) -> AsyncIterator[AsyncioLoop]:
    """Start an asyncio event loop on a thread of its own, yield the ``AsyncioLoop`` that runs coroutines on it,
    and on exit cancel what is left (waiting ``cancel_grace`` seconds at most), close the loop and join the
    thread."""
    token = trio.lowlevel.current_trio_token()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    finished = trio.Event()

    async def main() -> None:
        await stop.wait()
        leftovers = [task for task in asyncio.all_tasks(loop) if task is not asyncio.current_task(loop)]
        for task in leftovers:
            task.cancel()
        if leftovers:
            _, pending = await asyncio.wait(leftovers, timeout=cancel_grace)
            if pending:
                log.warning("asyncio loop closed with %d task(s) that ignored their cancel", len(pending))

    def thread_main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(main())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
            asyncio.set_event_loop(None)
            token.run_sync_soon(finished.set)

    thread = threading.Thread(target=thread_main, name=name, daemon=True)
    thread.start()
    owner = AsyncioLoop(loop, cancel_grace, token)
    try:
        yield owner
    finally:
        owner._closing = True
        loop.call_soon_threadsafe(stop.set)
        with trio.CancelScope(shield=True):
            await finished.wait()
        thread.join()
