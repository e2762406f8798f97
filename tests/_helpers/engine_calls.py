"""Engine calls run inline on the Trio thread, taking virtual time, instead of on a worker thread.

The engine actor hands each engine call to ``trio.to_thread.run_sync``; under
the virtual clock (``autojump_clock``) a real thread would let the clock jump
while it runs.  ``run_engine_calls(monkeypatch, runner)`` replaces that
function for one test with ``runner``, an ``async (fn, *args)`` that calls
``fn(*args)`` on the Trio thread, after sleeping whatever virtual time the
call stands for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

Runner = Callable[..., Awaitable[Any]]


def run_engine_calls(monkeypatch: pytest.MonkeyPatch, runner: Runner) -> None:
    """Every ``trio.to_thread.run_sync`` of this test runs through ``runner`` (its keyword arguments: the
    limiter and ``abandon_on_cancel``, meaningless inline, are dropped)."""

    async def run_sync(fn: Callable[..., Any], *args: Any, **_: Any) -> Any:
        return await runner(fn, *args)

    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)


def inline_runner(
    compute_seconds: float = 0.0, *, prompt_position_seconds: float = 0.0, log: list[tuple[float, str]] | None = None
) -> Runner:
    """Engine calls that take ``compute_seconds`` of virtual time each, and a call that runs system prompts
    ``prompt_position_seconds`` more per position; ``log`` gets (time, function name) of every call."""

    async def run(fn: Callable[..., Any], *args: Any) -> Any:
        if log is not None:
            log.append((trio.current_time(), fn.__name__))
        work = getattr(args[1], "prefill", None) if len(args) > 1 else None
        seconds = compute_seconds + prompt_position_seconds * sum((work or {}).values())
        if seconds:
            await trio.sleep(seconds)
        return fn(*args)

    return run
