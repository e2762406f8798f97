"""A WebSocket client on a bare connection that misbehaves at the transport level, as broken networks do.

wsproto does the framing; the test decides what reaches the wire and when:
stop reading (with a small receive buffer, so the server's writes back up),
freeze, reset the connection (SO_LINGER 0), send fragments forever, send a
frame header and nothing else, half-send the HTTP request.  The connection is
a real socket (:meth:`BadClient.connect`) or any stream whose ``socket``
takes ``SO_LINGER`` and ``close`` (:meth:`BadClient.over`: the virtual
network's, ``virtual_net.py``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import struct
from typing import Any

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

# The fault tests' server: faults show within a second or two.
CLIENT_TIMEOUT = 1.5
LIMIT = 64 * 1024


class Refused(Exception):
    """The server refused the WebSocket upgrade: ``status`` and the body it sent."""

    def __init__(self, status: int, body: str = ""):
        super().__init__(status, body)
        self.status = status
        self.body = body


class BadClient:
    def __init__(self, stream: trio.abc.Stream, ws: WSConnection, raw: Any):
        self.stream = stream  # the connection, or TLS over it
        self.raw = raw
        self.ws = ws
        self.closed: CloseConnection | None = None
        self._sending = trio.Lock()  # the reader answers pings while a sender may be writing
        self._pending: list[Any] = []  # events read but not handed out yet
        self.pings = 0  # WebSocket pings the server sent

    @classmethod
    async def connect(
        cls,
        port: int,
        path: str,
        *,
        rcvbuf: int | None = None,
        answer_pings: bool = True,
        timeout: float = 10.0,
        headers: list[tuple[str, str]] | None = None,
        tls: ssl.SSLContext | None = None,
        source: str | None = None,
    ) -> BadClient:
        """Open a WebSocket over a real socket to ``port``; ``source``: from this loopback address (``127.0.0.2``:
        another client than the tests' others, as the server sees it); the rest as :meth:`over`."""
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if source is not None:
            await sock.bind((source, 0))
        if rcvbuf is not None:  # before connect, so the window is small from the start
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        await sock.connect(("127.0.0.1", port))
        return await cls.over(
            trio.SocketStream(sock),
            path,
            host=f"127.0.0.1:{port}",
            answer_pings=answer_pings,
            timeout=timeout,
            headers=headers,
            tls=tls,
        )

    @classmethod
    async def over(
        cls,
        raw: Any,
        path: str,
        *,
        host: str,
        answer_pings: bool = True,
        timeout: float = 10.0,
        headers: list[tuple[str, str]] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> BadClient:
        """Open a WebSocket over the connection ``raw``: ``headers`` go with the upgrade; ``tls``: over TLS with
        this context.  Raises :class:`Refused` if the server refuses the upgrade."""
        stream: trio.abc.Stream = raw if tls is None else trio.SSLStream(raw, tls, server_hostname="127.0.0.1")
        client = cls(stream, WSConnection(ConnectionType.CLIENT), raw)
        client.answer_pings = answer_pings
        request = Request(
            host=host, target=path, extra_headers=[(name.encode(), value.encode()) for name, value in headers or []]
        )
        await client.send_raw(client.ws.send(request))
        with trio.fail_after(timeout):
            while True:
                events = await client._events()
                for i, event in enumerate(events):
                    if isinstance(event, AcceptConnection):
                        client._pending = events[i + 1 :]  # what came with the answer is the first of the rest
                        return client
                    if isinstance(event, RejectConnection):
                        body = await client._rejection_body(events[i + 1 :], event.has_body, timeout)
                        client.close()
                        raise Refused(event.status_code, body.decode("utf-8", "replace"))

    @property
    def socket(self) -> Any:
        return self.raw.socket

    async def _events(self) -> list[Any]:
        data = await self.stream.receive_some(65536)
        if not data:
            raise trio.BrokenResourceError("the server closed the connection")
        self.ws.receive_data(data)
        return list(self.ws.events())

    async def _rejection_body(self, events: list[Any], has_body: bool, timeout: float) -> bytes:
        body = b""
        with contextlib.suppress(trio.BrokenResourceError, trio.TooSlowError), trio.fail_after(timeout):
            while has_body:
                for event in events:
                    if isinstance(event, RejectData):
                        body += event.data
                        has_body = not event.body_finished
                events = await self._events() if has_body else []
        return body

    async def send(self, message: bytes | str) -> None:
        await self.send_raw(self.ws.send(Message(data=message)))

    async def send_raw(self, data: bytes) -> None:
        async with self._sending:
            await self.stream.send_all(data)

    async def receive(self, timeout: float = 10.0) -> bytes | str:
        """The next whole message (pings answered on the way); raises :class:`ServerClosed` on a close."""
        buffer: list[Any] = []
        with trio.fail_after(timeout):
            while True:
                if not self._pending:  # one read may bring several events: keep those not used yet
                    self._pending.extend(await self._events())
                while self._pending:
                    event = self._pending.pop(0)
                    if isinstance(event, Ping):
                        self.pings += 1
                        if self.answer_pings and self.ws.state is ConnectionState.OPEN:
                            await self.send_raw(self.ws.send(event.response()))
                    elif isinstance(event, CloseConnection):
                        self.closed = event
                        raise ServerClosed(event.code, event.reason)
                    elif isinstance(event, (TextMessage, BytesMessage)):
                        buffer.append(event.data)
                        if event.message_finished:
                            return "".join(buffer) if isinstance(event, TextMessage) else b"".join(buffer)

    async def read_until_closed(self, timeout: float = 10.0) -> tuple[int | None, list[bytes | str]]:
        """Read on until the server closes (with a close frame, or by dropping the connection)."""
        messages: list[bytes | str] = []
        try:
            with trio.fail_after(timeout):
                while True:
                    messages.append(await self.receive(timeout))
        except ServerClosed as closed:
            return closed.code, messages
        except (trio.BrokenResourceError, ConnectionResetError):
            return None, messages

    async def close_cleanly(self, timeout: float = 2.0) -> None:
        """Close as a well-behaved client does: a close frame (1000), the server's answer, then the socket."""
        await self.send_raw(self.ws.send(CloseConnection(code=1000)))
        with contextlib.suppress(ServerClosed, trio.BrokenResourceError), trio.move_on_after(timeout):
            while True:
                await self.receive(timeout)
        self.close()

    def reset(self) -> None:
        """Vanish with a TCP reset: SO_LINGER 0, then close."""
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.socket.close()

    def freeze(self) -> None:
        """Read and send nothing from now on.  A real socket's client just stops; a virtual connection's end is
        told to, so that nothing this client still does can reach the wire."""
        if hasattr(self.raw, "freeze"):
            self.raw.freeze()

    def close(self) -> None:
        """Close the socket (no matter what state it is in)."""
        self.socket.close()


class ServerClosed(Exception):
    def __init__(self, code: int, reason: str | None):
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


def frame_header(length: int, *, opcode: int = 0x2, fin: bool = True) -> bytes:
    """A masked client frame header claiming ``length`` payload bytes (and a mask key), no payload."""
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        head = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        head = struct.pack("!BBQ", first, 0x80 | 127, length)
    return head + os.urandom(4)


def masked_frame(payload: bytes, *, opcode: int, fin: bool) -> bytes:
    """One whole masked client frame (a fragment when ``fin`` is False; opcode 0 continues)."""
    header = frame_header(len(payload), opcode=opcode, fin=fin)
    mask = header[-4:]
    return header + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
