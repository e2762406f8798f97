"""A real server on a loopback port, tuned so that faults show within a second or two."""

from __future__ import annotations

import logging

import pytest
import trio

from pplex_trio.engine import EchoEngine
from pplex_trio.server import ServerSettings, serve

from _helpers.bad_client import CLIENT_TIMEOUT, LIMIT


@pytest.fixture(autouse=True)
def no_error_in_the_server_log(request, caplog):
    """Whatever a client does, the server logs no ERROR and no traceback (engine faults excepted: a model
    that fails is the server's own error, and is logged as one)."""
    caplog.set_level(logging.INFO)
    yield
    if request.node.get_closest_marker("server_errors_expected"):
        return
    records = caplog.get_records("setup") + caplog.get_records("call") + caplog.records  # (teardown so far)
    bad = [r for r in records if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()]
    assert not bad, "the server logged: " + "; ".join(f"{r.levelname} {r.name}: {r.getMessage()[:200]}"
                                                       for r in bad)


class Running:
    """A server in its own nursery, so a test can see when it has stopped."""

    def __init__(self, handle, stopped: trio.Event):
        self.handle = handle
        self.stopped = stopped

    @property
    def port(self) -> int:
        return self.handle.port


@pytest.fixture
def fault_server(nursery):
    """``await fault_server(**settings)`` → a Running server (slots 2, echo, 1.5 s client timeout)."""

    async def start(engine=None, **overrides):
        options = dict(host="127.0.0.1", port=0, slots=2, client_timeout=CLIENT_TIMEOUT,
                       keepalive_interval=0.5, max_message_bytes=LIMIT, shutdown_grace=0.5, queue_size=4)
        options.update(overrides)
        settings = ServerSettings(**options)
        engine = engine or EchoEngine(settings.slots, prefill_steps=8)
        stopped = trio.Event()
        ready: list = []
        got_handle = trio.Event()

        async def run():
            async with trio.open_nursery() as inner:
                ready.append(await inner.start(serve, settings, engine))
                got_handle.set()
            stopped.set()

        nursery.start_soon(run)
        await got_handle.wait()
        return Running(ready[0], stopped)

    return start
