"""A fake WebSocket and a server host for driving sessions without hypercorn, on Trio's virtual clock."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import trio

from pplex_trio._cli._engines import create_engine
from pplex_trio._metrics import Metrics
from pplex_trio.engine import Engine, EngineActor
from pplex_trio.server import ServerSettings, ServerContext
from pplex_trio.server._encoders import InlineEncoders
from pplex_trio.server._moshi_session import MoshiProtocol
from pplex_trio.server._raw_session import RawProtocol
from pplex_trio.server._session import Session


class FakeWebSocket:
    """What the session sees of a client; the test plays the client.

    ``client_send`` queues a message for the server; ``reading = False``
    makes the server's writes block, as a client that stops reading does once
    its buffers are full.  ``sent`` is everything the server wrote, in order.
    A client that vanishes is played by cancelling the session's scope, which
    is what the ASGI socket does when the connection drops.
    """

    def __init__(self, query: bytes = b"", client: str | None = None):
        self.query_string = query
        self.client = client
        self._inbox_send, self._inbox = trio.open_memory_channel[Any](math.inf)
        self.sent: list[bytes | str] = []
        self.accepted = False
        self.closed: tuple[int, str] | None = None
        self.reading = True
        self._changed = trio.lowlevel.ParkingLot()

    # -- the server's side ---------------------------------------------------

    async def accept(self, subprotocol: str | None = None) -> None:
        self.accepted = True
        self.subprotocol = subprotocol

    async def receive(self) -> bytes | str | None:
        return await self._inbox.receive()

    async def send(self, data: bytes | str) -> None:
        while not self.reading:
            await self._wait()
        await trio.lowlevel.checkpoint()
        self.sent.append(data)
        self._changed.unpark_all()

    async def close(self, code: int, reason: str = "") -> None:
        self.closed = (code, reason)
        self._changed.unpark_all()
        self.client_send(None)  # the client answers the close: Quart's receive then yields nothing more

    # -- the client's side ---------------------------------------------------

    def client_send(self, message: bytes | str | None) -> None:
        self._inbox_send.send_nowait(message)

    def resume_reading(self) -> None:
        self.reading = True
        self._changed.unpark_all()

    async def _wait(self) -> None:
        await self._changed.park()

    async def wait_for(self, predicate: Any, *, timeout: float = 30.0) -> Any:
        """Wait (virtual time) until ``predicate(sent)`` is truthy; return its value."""
        with trio.fail_after(timeout):
            while not (found := predicate(self.sent)):
                await self._wait()
        return found

    async def wait_closed(self, timeout: float = 30.0) -> tuple[int, str]:
        with trio.fail_after(timeout):
            while self.closed is None:
                await self._wait()
        return self.closed


def inline_runner(compute_seconds: float = 0.0, prompt_position_seconds: float = 0.0):
    """Engine calls on the Trio thread, each taking ``compute_seconds`` of virtual time, and a call that runs
    system prompts ``prompt_position_seconds`` more per position."""

    async def run(fn, *args):
        work = getattr(args[1], "prefill", None) if len(args) > 1 else None
        seconds = compute_seconds + prompt_position_seconds * sum((work or {}).values())
        if seconds:
            await trio.sleep(seconds)
        return fn(*args)

    return run


def make_host(engine: Engine | None = None, *, prompt_position_seconds: float = 0.0, **overrides: Any) -> ServerContext:
    """A ServerContext whose actor runs the engine inline (deterministic under the virtual clock); its system
    prompts cost ``prompt_position_seconds`` per position."""
    options: dict[str, Any] = dict(slots=1, model="echo:delay=1,prompt=2", keepalive_interval=0.5, input_grace_ms=0)
    options.update(overrides)
    settings = ServerSettings(**options)
    engine = engine or create_engine(settings)
    metrics = Metrics()
    actor = EngineActor(engine, settings, metrics=metrics,
                        run_sync=inline_runner(0.005, prompt_position_seconds=prompt_position_seconds))
    return ServerContext(settings=settings, engine=engine, actor=actor, metrics=metrics,
                       encoders=InlineEncoders("sphn"))


async def running_host(nursery: trio.Nursery, engine: Engine | None = None, **overrides: Any) -> ServerContext:
    """:func:`make_host`, with its engine actor ticking in ``nursery``."""
    host = make_host(engine, **overrides)  # (prompt_position_seconds among them)
    await nursery.start(host.actor.run)
    await nursery.start(host.encoders.run)
    return host


@dataclasses.dataclass
class Running:
    session: Session
    ws: FakeWebSocket
    scope: trio.CancelScope  # cancelling it is what the ASGI socket does when the connection drops
    done: trio.Event


async def start_session(nursery: trio.Nursery, host: ServerContext, protocol: str, query: bytes = b"") -> Running:
    """Start one session on a fake socket; returns at once (the session runs in ``nursery``)."""
    ws = FakeWebSocket(query)
    s = host.settings
    if protocol == "raw":
        wire: Any = RawProtocol(max_message_bytes=s.max_message_bytes, max_prompt_chars=s.max_prompt_chars,
                                voices=host.voices)
    else:
        wire = MoshiProtocol(host.encoders, max_message_bytes=s.max_message_bytes,
                             max_prompt_chars=s.max_prompt_chars, align=s.framing == "aligned", voices=host.voices)
    session = Session(ws, wire, host)
    scope = trio.CancelScope()
    done = trio.Event()

    async def run() -> None:
        with scope:
            await session.run()
        done.set()

    nursery.start_soon(run)
    await trio.lowlevel.checkpoint()
    return Running(session, ws, scope, done)
