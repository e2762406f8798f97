"""WebSocket test clients for both protocols, on trio-websocket."""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from typing import Any

import numpy as np
import sphn
import trio
from trio_websocket import ConnectionClosed

from _helpers import ogg
from pplex_trio.client import open_websocket

SR = 24_000
FRAME = 1920


def opus_messages(pcm: np.ndarray) -> list[list[bytes]]:
    """Per 80 ms frame, the Ogg pages a browser would send (one page per message)."""
    writer = sphn.OpusStreamWriter(SR)
    out = []
    for i in range(0, pcm.size - FRAME + 1, FRAME):
        out.append(ogg.split_pages(writer.append_pcm(np.ascontiguousarray(pcm[i : i + FRAME]))))
    return out


@dataclasses.dataclass
class Closed:
    code: int | None
    reason: str | None
    messages: list[Any]  # messages received before the close


async def read_until_closed(ws, timeout: float = 5.0) -> Closed:
    """Read everything until the server closes; fail if it does not within `timeout`."""
    messages = []
    with trio.fail_after(timeout):
        while True:
            try:
                messages.append(await ws.get_message())
            except ConnectionClosed as exc:
                return Closed(exc.reason.code, exc.reason.reason, messages)


def errors_in(messages: list[Any]) -> list[str]:
    """0x05 errors (Moshi) and {"type": "error"} (raw) among received messages."""
    out = []
    for m in messages:
        if isinstance(m, bytes) and m[:1] == b"\x05":
            out.append(m[1:].decode())
        elif isinstance(m, str):
            event = json.loads(m)
            if event.get("type") == "error":
                out.append(event["error"])
    return out


def moshi_url(base: str, **params: Any) -> str:
    return f"{base}/api/chat?{urllib.parse.urlencode(params)}" if params else f"{base}/api/chat"


async def moshi_handshake(ws, timeout: float = 10.0) -> int:
    """Wait for 0x00; return how many 0x06 pings came before it."""
    pings = 0
    with trio.fail_after(timeout):
        while True:
            message = await ws.get_message()
            assert isinstance(message, bytes), f"unexpected text frame {message!r}"
            if message == b"\x00":
                return pings
            if message == b"\x06":
                pings += 1
                continue
            raise AssertionError(f"unexpected message before the handshake: {message[:60]!r}")


async def moshi_talk(
    url: str, pcm: np.ndarray, want: int, timeout: float = 60.0, *, opener: Any = open_websocket
) -> list[np.ndarray]:
    """A Moshi conversation at ``url``: stream ``pcm`` in real time (40 ms Ogg pages) and return the first
    ``want`` decoded audio chunks that came back (``opener``: as :class:`RawWitness`'s)."""
    decoder = sphn.OpusStreamReader(SR)
    out: list[np.ndarray] = []
    async with opener(url) as ws:
        await moshi_handshake(ws, timeout=timeout)

        async def send() -> None:
            for pages in opus_messages(pcm.reshape(-1)):
                for page in pages:
                    await ws.send_message(b"\x01" + page)
                    await trio.sleep(0.04)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            with trio.fail_after(timeout):
                while len(out) < want:
                    message = await ws.get_message()
                    if message[0] == 1:
                        decoded = decoder.append_bytes(message[1:])
                        if decoded.size:
                            out.append(decoded)
            nursery.cancel_scope.cancel()
    return out


async def raw_open(ws, timeout: float = 10.0, **params: Any) -> list[dict]:
    """Send open; wait for ready; return the queued notices seen on the way."""
    await ws.send_message(json.dumps({"type": "open", **params}))
    notices = []
    with trio.fail_after(timeout):
        while True:
            event = json.loads(await ws.get_message())
            if event["type"] == "ready":
                return notices
            assert event["type"] == "queued", event
            notices.append(event)


class RawWitness:
    """A raw-protocol conversation that streams a known signal and checks it all comes back.

    Used beside bad clients: the server must keep serving it without losing
    a single frame.  ``opener`` opens its WebSocket (by default over a real
    socket; a virtual server passes its own).
    """

    def __init__(self, base: str, delay_frames: int = 1, *, opener: Any = open_websocket, **connect: Any):
        self.base = base
        self.opener = opener
        self.connect = connect  # the opener's ssl_context, token
        self.delay = delay_frames
        rng = np.random.default_rng(7)
        self.sent: list[np.ndarray] = []
        self.received: list[np.ndarray] = []
        self.text: list[str] = []
        self._rng = rng
        self.ready = trio.Event()
        self.stop = trio.Event()

    async def run(self) -> None:
        async with self.opener(f"{self.base}/v1/audio/duplex", **self.connect) as ws:
            await raw_open(ws, persona="witness")
            self.ready.set()

            async def send() -> None:
                deadline = trio.current_time()
                while not self.stop.is_set():
                    frame = self._rng.uniform(-0.5, 0.5, FRAME).astype(np.float32)
                    self.sent.append(frame)
                    await ws.send_message(frame.tobytes())
                    deadline += FRAME / SR
                    await trio.sleep_until(deadline)
                for _ in range(self.delay):  # push the last frames out of the echo's delay
                    await ws.send_message(np.zeros(FRAME, np.float32).tobytes())
                    deadline += FRAME / SR
                    await trio.sleep_until(deadline)
                await ws.send_message(json.dumps({"type": "close"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                while True:
                    message = await ws.get_message()
                    if isinstance(message, bytes):
                        self.received.append(np.frombuffer(message, dtype="<f4"))
                    else:
                        event = json.loads(message)
                        if event["type"] == "done":
                            break
                        assert event["type"] == "text", event
                        self.text.append(event["text"])

    def check(self) -> None:
        """Every frame came back, exactly, in order (ticks without input carry silence)."""
        n = len(self.sent)
        assert n > 5, "witness sent too little to prove anything"
        voiced = [frame for frame in self.received if frame.any()]
        assert len(voiced) == n, f"witness lost frames: {len(voiced)} of {n} came back"
        for got, sent in zip(voiced, self.sent):
            np.testing.assert_array_equal(got, sent)
        assert self.text == [f" {i}" for i in range(len(self.received))]
