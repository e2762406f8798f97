"""A Live API (``/v1/live/sessions``) client for tests on the virtual network.

Every server event it reads is checked against the ``openai`` SDK's own
``openai.types.live.ServerEvent`` union (pydantic validation of every declared
field and type), so a test that talks to the endpoint through it checks the
shape of all it receives.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import trio
from openai.types.live import ServerEvent
from pydantic import TypeAdapter
from trio_websocket import ConnectionClosed

SERVER_EVENT = TypeAdapter(ServerEvent)
PATH = "/v1/live/sessions"


def checked(message: bytes | str) -> dict[str, Any]:
    """One server message: JSON text, and a valid Live server event."""
    assert isinstance(message, str), f"a Live server sent a binary frame: {message[:40]!r}"
    event = json.loads(message)
    SERVER_EVENT.validate_python(event)
    return event


class LiveClient:
    """Sends client events; reads and checks server events (all kept in ``events``, in order)."""

    def __init__(self, ws: Any):
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.closed: tuple[int, str | None] | None = None

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send_message(json.dumps({"type": kind, **fields}))

    async def start(self, event_id: str | None = "start", **session: Any) -> dict[str, Any]:
        """``session.start`` (with a model unless given), then wait for ``session.started``."""
        await self.send(
            "session.start",
            session={"model": "gpt-live-1", **session},
            **({} if event_id is None else {"event_id": event_id}),
        )
        return await self.next("session.started")

    async def append(self, audio: bytes, event_id: str | None = None) -> None:
        await self.send(
            "session.input_audio.append",
            audio=base64.b64encode(audio).decode(),
            **({} if event_id is None else {"event_id": event_id}),
        )

    async def receive(self) -> dict[str, Any]:
        event = checked(await self.ws.get_message())
        self.events.append(event)
        return event

    async def next(self, kind: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
        """The next event (of ``kind``), the others on the way kept in ``events``."""
        with trio.fail_after(timeout):
            while True:
                event = await self.receive()
                if kind is None or event["type"] == kind:
                    return event

    async def until_closed(self, timeout: float = 10.0) -> tuple[int, list[dict[str, Any]]]:
        """Read until the server closes: its close code, and the events read on the way."""
        start = len(self.events)
        with trio.fail_after(timeout):
            while True:
                try:
                    await self.receive()
                except ConnectionClosed as exc:
                    return exc.reason.code, self.events[start:]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["type"] == kind]


def audio_of(events: list[dict[str, Any]]) -> bytes:
    """The output audio the events carried, in order."""
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "session.output_audio.delta")
