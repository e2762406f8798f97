#!/usr/bin/env python3
"""A WebSocket server that does nothing but the fixed stack's part of a conversation (for bench/stack_floor).

It speaks just enough of the Moshi protocol for bench/stack_floor's clients:
it accepts ``/api/chat``, sends the handshake byte, takes every message the
client sends, and every 80 ms (one clock for all connections, like the
engine's tick) sends each connection an audio message of a typical size and,
on ``--text-share`` of the ticks, a text message.  No engine, no sessions, no
metrics: what is left is Trio, hypercorn (h11, wsproto) and, with ``quart``,
Quart-Trio's WebSocket wrapper.  ``--codecs`` adds the codec work our server
does per conversation: sphn decodes every incoming page, and libopus
(complexity 5, in this process) encodes every outgoing 80 ms frame: the
latest 80 ms of the client's speech, as the echo engine would send back.

Usage: ``python bench/_floor_server.py {asgi,quart} [--codecs [--complexity 5]] [--text-share 0.3]``
(it prints hypercorn's "Running on http://HOST:PORT").
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys

import numpy as np
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from pplex_trio.codec._libopus import OPUS_COMPLEXITY, LibopusWriter  # noqa: E402

SR, FRAME, TICK = 24_000, 1920, 0.080
AUDIO_BYTES = 160  # about what one 80 ms frame of speech takes as two Ogg Opus pages at 32 kb/s


class Tick:
    """One clock for all connections: each tick wakes every sender once."""

    def __init__(self) -> None:
        self.event = trio.Event()

    async def run(self) -> None:
        deadline = trio.current_time()
        while True:
            deadline += TICK
            await trio.sleep_until(deadline)
            event, self.event = self.event, trio.Event()
            event.set()


class Conversation:
    """The per-connection work: take pages in, send a frame (and maybe text) out per tick."""

    def __init__(self, codecs: bool, text_share: float, complexity: int = OPUS_COMPLEXITY):
        import sphn

        self.reader = sphn.OpusStreamReader(SR) if codecs else None
        self.writer = LibopusWriter(complexity) if codecs else None
        self.pcm = np.zeros(FRAME, np.float32)
        self.text_share = text_share

    def take(self, message: bytes | str | None) -> None:
        if self.reader is not None and isinstance(message, bytes) and message[:1] == b"\x01":
            pcm = self.reader.append_bytes(message[1:])
            if pcm.size:  # the frame sent back is the latest 80 ms heard (silence encodes slower than speech)
                self.pcm = np.concatenate([self.pcm, pcm])[-FRAME:]

    def frame(self) -> list[bytes]:
        audio = self.writer.append_pcm(self.pcm) if self.writer is not None else bytes(AUDIO_BYTES)
        out = [b"\x01" + audio]
        if random.random() < self.text_share:
            out.append(b"\x02" + b" word")
        return out


def asgi_app(tick: Tick, codecs: bool, text_share: float, complexity: int):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            async with trio.open_nursery() as nursery:
                while True:
                    event = await receive()
                    if event["type"] == "lifespan.startup":
                        nursery.start_soon(tick.run)
                        await send({"type": "lifespan.startup.complete"})
                    elif event["type"] == "lifespan.shutdown":
                        nursery.cancel_scope.cancel()
                        await send({"type": "lifespan.shutdown.complete"})
                        return
        if scope["type"] != "websocket":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        conversation = Conversation(codecs, text_share, complexity)
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "bytes": b"\x00"})
        async with trio.open_nursery() as nursery:

            async def send_frames() -> None:
                while True:
                    await tick.event.wait()
                    for message in conversation.frame():
                        await send({"type": "websocket.send", "bytes": message})

            nursery.start_soon(send_frames)
            while True:
                event = await receive()
                if event["type"] == "websocket.disconnect":
                    nursery.cancel_scope.cancel()
                    return
                conversation.take(event.get("bytes") or event.get("text"))

    return app


def quart_app(tick: Tick, codecs: bool, text_share: float, complexity: int):
    from quart import websocket
    from quart_trio import QuartTrio

    app = QuartTrio(__name__)

    @app.before_serving
    async def start_tick() -> None:
        app.nursery.start_soon(tick.run)

    @app.websocket("/api/chat")
    async def chat() -> None:
        conversation = Conversation(codecs, text_share, complexity)
        await websocket.accept()
        await websocket.send(b"\x00")
        async with trio.open_nursery() as nursery:

            async def send_frames() -> None:
                while True:
                    await tick.event.wait()
                    for message in conversation.frame():
                        await websocket.send(message)

            nursery.start_soon(send_frames)
            while True:
                conversation.take(await websocket.receive())

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("framework", choices=("asgi", "quart"))
    parser.add_argument("--codecs", action="store_true")
    parser.add_argument("--text-share", type=float, default=0.3)
    parser.add_argument("--complexity", type=int, default=OPUS_COMPLEXITY, help="libopus complexity of --codecs")
    args = parser.parse_args()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.errorlog = "-"
    config.accesslog = None
    config.websocket_ping_interval = 15.0 / 3  # as our server at its default --client-timeout
    tick = Tick()
    make = asgi_app if args.framework == "asgi" else quart_app
    trio.run(serve, make(tick, args.codecs, args.text_share, args.complexity), config)


if __name__ == "__main__":
    main()
