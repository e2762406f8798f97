"""Running the server: hypercorn's trio ``serve()`` inside our own nursery.

The nursery holds three things: the engine actor, hypercorn, and (when we
own the process) a signal watcher.  Shutdown is graceful: every conversation
is closed with 1001 (going away), then hypercorn stops, then the actor.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import signal
from functools import partial

import hypercorn.config
import hypercorn.trio
import trio

from ..engine import Engine
from ._app import create_app
from ._encoders import Encoders
from ._settings import ServerSettings
from ._state import ServerState

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServerHandle:
    """What :func:`serve` hands back through ``task_status`` once it listens."""

    state: ServerState
    binds: list[str]
    _stop: trio.Event

    @property
    def port(self) -> int:
        return int(self.binds[0].rsplit(":", 1)[1])

    @property
    def http_url(self) -> str:
        return self.binds[0]

    @property
    def ws_url(self) -> str:
        return self.binds[0].replace("http://", "ws://", 1)

    async def shutdown(self) -> None:
        """Close every conversation with 1001 within the grace period, then stop."""
        state = self.state
        if state.shutting_down:
            return
        logger.info("shutting down: closing %d conversation(s)", len(state.sessions))
        state.begin_shutdown()
        with trio.move_on_after(state.settings.shutdown_grace):
            while state.sessions:
                await trio.sleep(0.01)
        self._stop.set()


def hypercorn_config(settings: ServerSettings) -> hypercorn.config.Config:
    config = hypercorn.config.Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    # Our own limit answers with a clear 0x05 message; hypercorn's is a backstop.
    config.websocket_max_message_size = 2 * settings.max_message_bytes
    config.graceful_timeout = settings.shutdown_grace
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


async def serve(
    settings: ServerSettings,
    engine: Engine,
    *,
    handle_signals: bool = False,
    encoders: Encoders | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until shut down (by a signal if ``handle_signals``, or the handle).

    ``encoders`` replaces the ``--opus-encoder`` choice (for benchmarks).
    """
    state = ServerState.create(settings, engine, encoders=encoders)
    app = create_app(state)
    stop = trio.Event()
    _quiet_garbage_collector()
    async with trio.open_nursery() as nursery:
        await nursery.start(state.actor.run)
        await nursery.start(state.encoders.run)
        binds = await nursery.start(partial(_http, app, hypercorn_config(settings), stop.wait, nursery))
        handle = ServerHandle(state, binds, stop)
        if handle_signals:
            nursery.start_soon(_watch_signals, handle)
        logger.info("serving %s with %d slot(s) on %s", engine.name, engine.num_slots, ", ".join(binds))
        task_status.started(handle)


def _quiet_garbage_collector() -> None:
    """Keep the cyclic garbage collector from stalling the 80 ms lockstep.

    Everything alive at startup (torch, the model, the app) is frozen out of
    the collector's sight, so a full collection scans only what conversations
    allocate: measured here, full collections took 60-180 ms before (each one
    a late tick for every conversation) and a few ms after.
    """
    gc.collect()
    gc.freeze()


async def _http(app, config, stop_wait, nursery: trio.Nursery, task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
    await hypercorn.trio.serve(app, config, shutdown_trigger=stop_wait, task_status=task_status)
    nursery.cancel_scope.cancel()  # hypercorn is done: stop the actor and the signal watcher


async def _watch_signals(handle: ServerHandle) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            if handle.state.shutting_down:
                logger.warning("second %s: stopping now", signal.Signals(signum).name)
                handle._stop.set()
                return
            logger.info("%s received", signal.Signals(signum).name)
            await handle.shutdown()
