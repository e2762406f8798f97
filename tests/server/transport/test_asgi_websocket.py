"""The conversation routes on ASGI (ConversationRouter, AsgiWebSocket): Quart's semantics, no Quart.

Driven with a fake ASGI server (two channels standing for hypercorn's
receive and send) on the virtual clock, so each case is exact: what the
handler reads, what goes out, what a disconnect does, and no wait (a close
budget) costs real time.
"""

from __future__ import annotations

import math
from typing import Any

import trio
import trio.testing

from pplex_trio.server.transport._asgi_websocket import AsgiWebSocket, ConversationRouter

SCOPE = {
    "type": "websocket",
    "path": "/api/chat",
    "query_string": b"voice_prompt=NATF0.pt",
    "headers": [(b"openai-beta", b"realtime=v1"), (b"host", b"x")],
    "subprotocols": ["a", "b"],
}


class FakeAsgiServer:
    """Plays hypercorn: ``events`` for the app to receive, ``sent`` for what it sends."""

    def __init__(self, *events: dict[str, Any]):
        self._to_app, self._app_inbox = trio.open_memory_channel[dict[str, Any]](math.inf)
        for event in events:
            self._to_app.send_nowait(event)
        self.sent: list[dict[str, Any]] = []

    def push(self, event: dict[str, Any]) -> None:
        self._to_app.send_nowait(event)

    async def receive(self) -> dict[str, Any]:
        return await self._app_inbox.receive()

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(event)


class RecordingApp:
    """Stands for the Quart app: records what reached it."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope, receive, send) -> None:
        self.scopes.append(scope)


async def test_the_socket_reads_the_scope_and_skips_the_connect_event(autojump_clock):
    server = FakeAsgiServer(
        {"type": "websocket.connect"},
        {"type": "websocket.receive", "bytes": b"\x01ogg"},
        {"type": "websocket.receive", "bytes": None, "text": '{"type": "open"}'},
        {"type": "websocket.receive", "bytes": b"", "text": None},
    )
    ws = AsgiWebSocket(SCOPE, server.receive, server.send)
    assert ws.query_string == b"voice_prompt=NATF0.pt"
    assert ws.headers.get("OpenAI-Beta") == "realtime=v1"  # case-insensitive, as Quart's headers
    assert ws.requested_subprotocols == ["a", "b"]
    assert [await ws.receive() for _ in range(3)] == [b"\x01ogg", '{"type": "open"}', b""]


async def test_accept_send_and_close_become_asgi_events(autojump_clock):
    server = FakeAsgiServer()
    ws = AsgiWebSocket(SCOPE, server.receive, server.send)
    await ws.accept(subprotocol="b")
    await ws.accept(subprotocol="b")  # once only
    await ws.send(b"\x00")
    await ws.send("text")
    await ws.close(1008, "why")
    await ws.close(1000)  # once only
    assert server.sent == [
        {"type": "websocket.accept", "subprotocol": "b", "headers": []},
        {"type": "websocket.send", "bytes": b"\x00", "text": None},
        {"type": "websocket.send", "bytes": None, "text": "text"},
        {"type": "websocket.close", "code": 1008, "reason": "why"},
    ]


async def test_a_disconnect_cancels_the_whole_handler(autojump_clock):
    server = FakeAsgiServer({"type": "websocket.connect"})
    reached: list[str] = []

    async def handler(ws: AsgiWebSocket) -> None:
        await ws.accept()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)  # a sibling task (say, the send loop) goes too
            try:
                await ws.receive()
            finally:
                reached.append("unwound")
        reached.append("not reached")

    router = ConversationRouter(RecordingApp(), {"/api/chat": handler})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(router, SCOPE, server.receive, server.send)
        await trio.testing.wait_all_tasks_blocked()
        server.push({"type": "websocket.disconnect", "code": 1006})
    assert reached == ["unwound"]
    assert server.sent == [{"type": "websocket.accept", "subprotocol": None, "headers": []}]  # no close: gone


async def test_a_handler_that_returns_without_closing_closes_with_1000(autojump_clock):
    server = FakeAsgiServer()

    async def handler(ws: AsgiWebSocket) -> None:
        await ws.accept()

    await ConversationRouter(RecordingApp(), {"/api/chat": handler})(SCOPE, server.receive, server.send)
    assert server.sent[-1] == {"type": "websocket.close", "code": 1000}


async def test_a_handler_that_closed_is_not_closed_again(autojump_clock):
    server = FakeAsgiServer()

    async def handler(ws: AsgiWebSocket) -> None:
        await ws.accept()
        await ws.close(1003, "no")

    await ConversationRouter(RecordingApp(), {"/api/chat": handler})(SCOPE, server.receive, server.send)
    assert [e["type"] for e in server.sent] == ["websocket.accept", "websocket.close"]


async def test_everything_else_goes_to_the_app(autojump_clock):
    app = RecordingApp()

    async def handler(ws: AsgiWebSocket) -> None:
        raise AssertionError("not this route")

    router = ConversationRouter(app, {"/api/chat": handler})
    server = FakeAsgiServer()
    others = [{"type": "http", "path": "/api/chat"}, {"type": "websocket", "path": "/elsewhere"}, {"type": "lifespan"}]
    for scope in others:
        await router(scope, server.receive, server.send)
    assert app.scopes == others and server.sent == []
    assert router.websocket_paths == {"/api/chat"}
