"""The real server (``pplex_trio.server.serve``) on the virtual network and Trio's virtual clock.

Everything runs in the test's own Trio run, so virtual time is exact: the
connections are in memory (``virtual_net.py``), Opus is encoded on the event
loop (``opus_encoder="inline"``), and the work the server would hand to a
thread (engine calls, voice decoding, file writes) runs inline through
:class:`InlineThreads`, which stands in for ``trio.to_thread.run_sync``: a
real thread would let the virtual clock jump ahead while it worked.  What an
engine call costs is given to the clock instead: ``compute_seconds`` per call,
plus whatever the echo engine's stand-ins for GPU time ask for
(``step_seconds``, ``prefill_seconds``, a hung step's ``hang_seconds``), which
are slept on the virtual clock after the call.

The ``virtual_server`` fixture (``tests/conftest.py``) starts one; the test
must also ask for pytest-trio's ``autojump_clock``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from trio_websocket import WebSocketConnection

from _helpers.bad_client import BadClient
from _helpers.virtual_clients import VirtualTransport, open_websocket
from _helpers.virtual_net import VirtualNetwork, VirtualStream
from _helpers.ws import RawWitness
from pplex_trio.engine import EchoEngine, Engine
from pplex_trio.server import ServerHandle, ServerSettings, serve

FIRST_PORT = 8998  # the first server of a test listens here, the next one on the port after


class InlineThreads:
    """``trio.to_thread.run_sync`` for a test on the virtual clock: the call runs on the Trio thread, then the
    clock is given what it cost.  ``hold_engine`` makes engine calls wait (as a GPU call that has not come back)
    until ``release_engine``."""

    def __init__(self, compute_seconds: float = 0.0):
        self.compute_seconds = compute_seconds  # virtual time each engine call takes
        self.owed = 0.0  # what the call in progress asked to sleep (the echo engine's stand-ins for GPU time)
        self._engine_may_run = trio.Event()
        self._engine_may_run.set()
        self.engine_held = trio.Event()  # set once a call waits at the hold

    def sleep(self, seconds: float) -> None:
        """The echo engine's ``time.sleep``: owed to the virtual clock, paid when the call returns."""
        self.owed += seconds

    def hold_engine(self) -> None:
        self._engine_may_run = trio.Event()
        self.engine_held = trio.Event()

    def release_engine(self) -> None:
        self._engine_may_run.set()

    async def run_sync(self, fn: Callable[..., Any], *args: Any, **_thread_options: Any) -> Any:
        engine_call = _is_engine_call(fn, args)
        if engine_call and not self._engine_may_run.is_set():
            self.engine_held.set()
            await self._engine_may_run.wait()
        await trio.lowlevel.checkpoint()
        self.owed = 0.0
        try:
            result = fn(*args)
        finally:
            cost, self.owed = self.owed + (self.compute_seconds if engine_call else 0.0), 0.0
        if cost:
            await trio.sleep(cost)
        return result


def _is_engine_call(fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
    """An engine's own method (a reset), or a call handed the engine (a tick, prompts, a voice)."""
    return isinstance(getattr(fn, "__self__", None), Engine) or any(isinstance(arg, Engine) for arg in args)


@dataclasses.dataclass
class VirtualServer:
    """A running server on the virtual network: its handle's attributes, and clients that reach it."""

    handle: ServerHandle
    network: VirtualNetwork
    threads: InlineThreads
    stopped: trio.Event  # serve() has returned

    # -- the handle ------------------------------------------------------------

    @property
    def server(self) -> Any:
        return self.handle.server

    @property
    def engine(self) -> Any:
        return self.handle.server.engine

    @property
    def port(self) -> int:
        return self.handle.port

    @property
    def http_url(self) -> str:
        return self.handle.http_url

    @property
    def ws_url(self) -> str:
        return self.handle.ws_url

    async def shutdown(self) -> None:
        await self.handle.shutdown()

    async def drain_then_shutdown(self, seconds: float) -> None:
        await self.handle.drain_then_shutdown(seconds)

    # -- clients -----------------------------------------------------------------

    def http(self, *, source: str = "127.0.0.1", **options: Any) -> httpx.AsyncClient:
        """An httpx client of this server (``base_url`` set), over the virtual network from ``source``;
        ``ssl_context`` for a TLS server."""
        transport = VirtualTransport(self.network, source=source, ssl_context=options.pop("ssl_context", None))
        return httpx.AsyncClient(base_url=self.http_url, transport=transport, **options)

    async def get(self, path: str, **options: Any) -> httpx.Response:
        async with self.http() as http:
            return await http.get(path, **options)

    async def get_json(self, path: str) -> Any:
        response = await self.get(path)
        response.raise_for_status()
        return response.json()

    async def metrics(self) -> str:
        return (await self.get("/metrics")).text

    async def resumes(self) -> dict[str, float]:
        """``pplex_resumes_total`` by outcome, as ``/metrics`` says."""
        counts = {}
        for line in (await self.metrics()).splitlines():
            if line.startswith("pplex_resumes_total{"):
                counts[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
        return counts

    def open_websocket(self, url: str, **options: Any) -> contextlib.AbstractAsyncContextManager[WebSocketConnection]:
        """As ``pplex_trio.client.open_websocket``; ``url`` may be a path of this server."""
        return open_websocket(self.network, self._url(url), **options)

    async def open_tcp_stream(self, host: str, port: int, **_options: Any) -> VirtualStream:
        """``trio.open_tcp_stream`` on the virtual network: a test of code that opens its own connections (our
        command-line client) patches it in."""
        return await self.network.connect(host, port)

    async def connect(self, *, source: str = "127.0.0.1", receive_buffer: int | None = None) -> VirtualStream:
        """A bare connection to the server (the client's end)."""
        return await self.network.connect("127.0.0.1", self.port, source=source, receive_buffer=receive_buffer)

    async def bad_client(
        self, path: str, *, source: str = "127.0.0.1", receive_buffer: int | None = None, **options: Any
    ) -> BadClient:
        """A :class:`BadClient` upgraded to ``path`` over a virtual connection (``tls``, ``headers`` …)."""
        raw = await self.connect(source=source, receive_buffer=receive_buffer)
        return await BadClient.over(raw, path, host=f"127.0.0.1:{self.port}", **options)

    def witness(self, **options: Any) -> RawWitness:
        """A raw conversation that must get every frame it sends back (see :class:`RawWitness`)."""
        return RawWitness(self.ws_url, opener=self.open_websocket, **options)

    async def start_witness(self, nursery: trio.Nursery, **options: Any) -> tuple[RawWitness, trio.Event]:
        """A witness (:meth:`witness`) run in ``nursery``, once it is live; the event is set when it has finished."""
        witness = self.witness(**options)
        done = trio.Event()

        async def run() -> None:
            await witness.run()
            done.set()

        nursery.start_soon(run)
        with trio.fail_after(5):
            await witness.ready.wait()
        return witness, done

    def _url(self, url: str) -> str:
        return self.ws_url + url if url.startswith("/") else url


class VirtualServers:
    """What the ``virtual_server`` fixture hands a test: ``await virtual_server(...)`` starts a server."""

    def __init__(self, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, tmp_path: Any):
        self._nursery = nursery
        self._monkeypatch = monkeypatch
        self._tmp_path = tmp_path
        self.network = VirtualNetwork()
        self.threads: InlineThreads | None = None
        self._next_port = FIRST_PORT

    async def __call__(
        self,
        engine: Engine | None = None,
        *,
        prefill_steps: int = 2,
        delay_frames: int = 1,
        compute_seconds: float = 0.0,
        **overrides: Any,
    ) -> VirtualServer:
        """Serve with these settings (slots 2, inline Opus, the voice store in the test's folder) and ``engine``,
        by default an echo engine with ``prefill_steps`` and ``delay_frames``; each engine call takes
        ``compute_seconds`` of virtual time."""
        if not isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
            pytest.fail("a virtual server runs on the virtual clock: the test must ask for autojump_clock")
        self._run_threads_inline(compute_seconds)
        options: dict[str, Any] = dict(
            host="127.0.0.1",
            port=self._next_port,
            slots=2,
            opus_encoder="inline",
            voice_store=self._tmp_path / "voice-store",
            first_frame_timeout=0,
        )  # (stepped from the handshake, unless a test says)
        options.update(overrides)
        self._next_port += 1
        settings = ServerSettings(**options)
        if engine is None:
            engine = EchoEngine(settings.slots, prefill_steps=prefill_steps, delay_frames=delay_frames)
        listener = self.network.listen(settings.host, settings.port)
        stopped = trio.Event()

        async def run(task_status: trio.TaskStatus[ServerHandle]) -> None:
            try:
                async with trio.open_nursery() as inner:
                    task_status.started(await inner.start(partial(serve, settings, engine, listeners=[listener])))
            finally:
                stopped.set()

        handle = await self._nursery.start(run)
        assert self.threads is not None
        return VirtualServer(handle, self.network, self.threads, stopped)

    def _run_threads_inline(self, compute_seconds: float) -> None:
        if self.threads is None:
            self.threads = InlineThreads(compute_seconds)
            self._monkeypatch.setattr(trio.to_thread, "run_sync", self.threads.run_sync)
            # The echo engine's stand-ins for GPU time sleep on its module's `time`: owed to the virtual clock.
            self._monkeypatch.setattr("pplex_trio.engine._echo.time", types.SimpleNamespace(sleep=self.threads.sleep))
        self.threads.compute_seconds = compute_seconds
