"""A fake WebSocket and a server host for driving sessions without hypercorn, on Trio's virtual clock."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import trio

from pplex_trio._cli._engines import create_engine
from pplex_trio._metrics import Metrics
from pplex_trio.engine import Engine, EngineActor
from pplex_trio.protocol import exotel, plivo, telnyx, twilio
from pplex_trio.server import ServerContext, ServerSettings
from pplex_trio.server._encoders import InlineEncoders
from pplex_trio.server.sessions._live import LiveProtocol
from pplex_trio.server.sessions._moshi import MoshiProtocol
from pplex_trio.server.sessions._raw import RawProtocol
from pplex_trio.server.sessions._session import Session
from pplex_trio.server.sessions._telephony import TelephonyProtocol

from .engine_calls import inline_runner, run_engine_calls


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
        self.disconnected = trio.CancelScope()  # cancelled when the client is gone, as AsgiWebSocket's

    # -- the server's side ---------------------------------------------------

    async def accept(self, subprotocol: str | None = None) -> None:
        self.accepted = True
        self.subprotocol = subprotocol

    async def receive(self) -> bytes | str:
        message = await self._inbox.receive()
        if message is None:  # the client answered the close: the ASGI server says so, which unwinds the handler
            self.disconnected.cancel()
            await trio.lowlevel.checkpoint()  # raises Cancelled
        return message

    async def send(self, data: bytes | str) -> None:
        while not self.reading:
            await self._wait()
        await trio.lowlevel.checkpoint()
        self.sent.append(data)
        self._changed.unpark_all()

    async def close(self, code: int, reason: str = "") -> None:
        self.closed = (code, reason)
        self._changed.unpark_all()
        self.client_send(None)  # the client answers the close (the next receive unwinds the handler)

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


def make_host(
    monkeypatch: Any, engine: Engine | None = None, *, prompt_position_seconds: float = 0.0, **overrides: Any
) -> ServerContext:
    """A ServerContext whose actor runs the engine inline (deterministic under the virtual clock: see
    ``engine_calls``), 5 ms a call; its system prompts cost ``prompt_position_seconds`` per position."""
    options: dict[str, Any] = dict(
        slots=1, model="echo:delay=1,prompt=2", keepalive_interval=0.5, input_grace_ms=0, first_frame_timeout=0
    )  # (stepped from the handshake unless a test says)
    options.update(overrides)
    settings = ServerSettings(**options)
    engine = engine or create_engine(settings)
    metrics = Metrics()
    run_engine_calls(monkeypatch, inline_runner(0.005, prompt_position_seconds=prompt_position_seconds))
    actor = EngineActor(engine, settings, metrics=metrics)
    return ServerContext(
        settings=settings, engine=engine, actor=actor, metrics=metrics, encoders=InlineEncoders("sphn")
    )


async def running_host(
    monkeypatch: Any, nursery: trio.Nursery, engine: Engine | None = None, **overrides: Any
) -> ServerContext:
    """:func:`make_host`, with its engine actor ticking in ``nursery``."""
    host = make_host(monkeypatch, engine, **overrides)  # (prompt_position_seconds among them)
    await nursery.start(host.actor.run)
    await nursery.start(host.encoders.run)
    return host


CARRIERS: dict[str, Any] = {
    "twilio": twilio.TwilioCarrier,
    "telnyx": telnyx.TelnyxCarrier,
    "plivo": plivo.PlivoCarrier,
    "exotel": exotel.ExotelCarrier,
}


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
        wire: Any = RawProtocol(max_prompt_chars=s.max_prompt_chars, voices=host.voices)
    elif protocol == "live":
        wire = LiveProtocol(
            model="gpt-live-1",
            session_id="sess_fuzz",
            expires_at=0,
            voices=host.voices,
            max_prompt_chars=s.max_prompt_chars,
            align=False,
        )
    elif protocol in CARRIERS:
        wire = TelephonyProtocol(
            CARRIERS[protocol](),
            token=s.auth_token,
            voices=host.voices,
            max_prompt_chars=s.max_prompt_chars,
            align=False,
        )
    else:
        wire = MoshiProtocol(
            host.encoders, max_prompt_chars=s.max_prompt_chars, align=s.framing == "aligned", voices=host.voices
        )
    session = Session(ws, wire, host)
    scope = ws.disconnected
    done = trio.Event()

    async def run() -> None:
        with scope:
            await session.run()
        done.set()

    nursery.start_soon(run)
    await trio.lowlevel.checkpoint()
    return Running(session, ws, scope, done)
