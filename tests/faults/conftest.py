"""The fault suites' server, tuned so that faults show within a second or two: on the virtual network and clock
(``fault_server``), or on a loopback port with real sockets (``real_fault_server``, for the few cases that check
the virtual network against the kernel).  Both offer the same clients, so a case is written once."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
import trio

from _helpers.bad_client import CLIENT_TIMEOUT, LIMIT, BadClient
from _helpers.ws import RawWitness
from pplex_trio.client import open_websocket
from pplex_trio.engine import EchoEngine, Engine
from pplex_trio.server import ServerHandle, ServerSettings, serve

PREFILL_STEPS = 8  # a system prompt long enough to misbehave in (run instantly between ticks)
SETTINGS = dict(
    slots=2,
    client_timeout=CLIENT_TIMEOUT,
    keepalive_interval=0.5,
    max_message_bytes=LIMIT,
    shutdown_grace=0.5,
    queue_size=4,
    first_frame_timeout=0,
    resume_seconds=0,  # a dropped raw call ends at once (its pause for a resume: tests/server/sessions/test_resume.py)
)  # (stepped from the handshake)


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
    assert not bad, "the server logged: " + "; ".join(f"{r.levelname} {r.name}: {r.getMessage()[:200]}" for r in bad)


@pytest.fixture
def fault_server(virtual_server):
    """``await fault_server(engine=None, **settings)`` → a ``VirtualServer`` (slots 2, echo, 1.5 s client
    timeout); the test asks for ``autojump_clock`` too."""

    async def start(engine: Engine | None = None, **overrides: Any):
        return await virtual_server(engine, prefill_steps=PREFILL_STEPS, **{**SETTINGS, **overrides})

    return start


@pytest.fixture
def real_fault_server(nursery):
    """``await real_fault_server(engine=None, **settings)`` → the same server on a loopback port (a
    :class:`RealServer`), on the real clock."""

    async def start(engine: Engine | None = None, **overrides: Any) -> RealServer:
        settings = ServerSettings(**{"host": "127.0.0.1", "port": 0, **SETTINGS, **overrides})
        engine = engine or EchoEngine(settings.slots, prefill_steps=PREFILL_STEPS)
        stopped = trio.Event()

        async def run(task_status: trio.TaskStatus[ServerHandle]) -> None:
            try:
                async with trio.open_nursery() as inner:
                    task_status.started(await inner.start(serve, settings, engine))
            finally:
                stopped.set()

        return RealServer(await nursery.start(run), stopped)

    return start


class RealServer:
    """A server on a loopback port with the clients a ``VirtualServer`` offers, over real sockets."""

    def __init__(self, handle: ServerHandle, stopped: trio.Event):
        self.handle = handle
        self.stopped = stopped

    @property
    def server(self) -> Any:
        return self.handle.server

    @property
    def port(self) -> int:
        return self.handle.port

    @property
    def http_url(self) -> str:
        return self.handle.http_url

    @property
    def ws_url(self) -> str:
        return self.handle.ws_url

    def http(self, *, ssl_context: Any = None, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.http_url, verify=ssl_context or True, **options)

    async def get(self, path: str, **options: Any) -> httpx.Response:
        async with self.http() as http:
            return await http.get(path, **options)

    async def get_json(self, path: str) -> Any:
        response = await self.get(path, timeout=5)
        response.raise_for_status()
        return response.json()

    def open_websocket(self, url: str, **options: Any) -> Any:
        return open_websocket(self.ws_url + url if url.startswith("/") else url, **options)

    async def connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream("127.0.0.1", self.port)

    async def bad_client(self, path: str, *, receive_buffer: int | None = None, **options: Any) -> BadClient:
        return await BadClient.connect(self.port, path, rcvbuf=receive_buffer, **options)

    def witness(self, **options: Any) -> RawWitness:
        return RawWitness(self.ws_url, **options)
