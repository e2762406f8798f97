"""An in-memory network that behaves like TCP as far as the server can tell, for tests on Trio's virtual clock.

A :class:`VirtualNetwork` holds listeners by address; ``connect`` gives the
client's end of a new connection and hands the server's end to the listener,
as a kernel's accept queue would.  Each connection is two one-way pipes, each
holding at most ``buffer`` bytes (a socket's send and receive buffers
together), so:

* a client that stops reading makes the server's writes block once the
  buffers are full, and a frozen client (:meth:`VirtualStream.freeze`) reads
  and sends nothing ever again;
* ``send_eof`` is a half-close (a FIN): the other side reads what was sent,
  then ``b""``;
* a reset (:meth:`VirtualStream.reset`, or the server's abort: ``SO_LINGER``
  0 then ``close`` on the fake socket) breaks the connection for both sides at
  once: every write on either side raises ``trio.BrokenResourceError``, and so
  does every read once the bytes that had reached that side are read (as on
  Linux, where the bytes already in a receive queue are read before the reset
  is reported: a close frame written just before an abort still arrives);
* closing an end with bytes from the peer still unread is a reset too, as a
  real TCP stack answers such a close with RST;
* a **stall** (:meth:`VirtualStream.stall`) holds the bytes one end sends on
  their way (a Wi-Fi retry, a handover, a retransmission): they pile up (the
  writer blocks once the buffer is full) and arrive all at once, in order,
  when the stall ends;
* writing to an end the peer has closed raises ``trio.BrokenResourceError``;
  closing an end wakes its own blocked reads and writes with
  ``trio.ClosedResourceError``, as closing a Trio socket does.

Each end has a fake ``socket`` with ``family``, ``getpeername()``,
``getsockname()``, ``setsockopt()`` and ``close()``: what the transport's
``GuardedStream`` and hypercorn use.  Nothing here takes time: bytes arrive
the moment they are written, and only the test's virtual clock moves.
"""

from __future__ import annotations

import errno
import itertools
import socket
import struct
from typing import Any

import trio

DEFAULT_BUFFER = 64 * 1024  # bytes one direction of a connection holds before the writer blocks
READ_BYTES = 65536  # what receive_some returns at most when not told


def _reset() -> ConnectionResetError:
    """The error a socket reports for a reset (with its errno and text: TLS code reads them)."""
    return ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")


class _Pipe:
    """One direction of a connection: the bytes written and not yet read, and whether the writer is done."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.data = bytearray()
        self.eof = False  # the writer half-closed (or closed): after the data, the reader gets b""
        self.reader_gone = False  # the reading end is closed: writing is a broken pipe
        self.stalled = False  # the bytes are held on their way: the reader sees none of them yet


class _Connection:
    """What both ends share: the two pipes, whether the connection was reset, and one wake-up for any change."""

    def __init__(self, to_server: int, to_client: int):
        self.to_server = _Pipe(to_server)
        self.to_client = _Pipe(to_client)
        self.broken = False  # reset: both sides see a broken connection
        self.changed = trio.lowlevel.ParkingLot()

    def reset(self) -> None:
        self.broken = True
        self.changed.unpark_all()


class FakeSocket:
    """The ``socket`` of one end: its addresses, the options set on it, and ``close``."""

    family = socket.AF_INET
    type = socket.SOCK_STREAM

    def __init__(self, stream: VirtualStream, local: tuple[str, int], peer: tuple[str, int]):
        self._stream = stream
        self._local = local
        self._peer = peer
        self.options: dict[tuple[int, int], Any] = {}

    def getsockname(self) -> tuple[str, int]:
        self._check_open()
        return self._local

    def getpeername(self) -> tuple[str, int]:
        self._check_open()
        if self._stream._connection.broken:
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
        return self._peer

    def setsockopt(self, level: int, option: int, value: Any) -> None:
        self._check_open()
        self.options[(level, option)] = value

    def getsockopt(self, level: int, option: int, buflen: int | None = None) -> Any:
        return self.options.get((level, option), 0)

    def close(self) -> None:
        """Close this end; with ``SO_LINGER`` set to 0 (an abort), reset the connection."""
        linger = self.options.get((socket.SOL_SOCKET, socket.SO_LINGER))
        self._stream._close(reset=linger is not None and struct.unpack("ii", linger) == (1, 0))

    def fileno(self) -> int:
        return -1

    def _check_open(self) -> None:
        if self._stream._closed:
            raise OSError(errno.EBADF, "Bad file descriptor")


class VirtualStream(trio.abc.HalfCloseableStream):
    """One end of a virtual connection (see the module's docstring for what it does as TCP would)."""

    def __init__(
        self, connection: _Connection, inbound: _Pipe, outbound: _Pipe, local: tuple[str, int], peer: tuple[str, int]
    ):
        self._connection = connection
        self._in = inbound
        self._out = outbound
        self._closed = False
        self._frozen = False
        self._busy_receive = False  # a second task reading (or writing) at once is a bug, as on a socket stream
        self._busy_send = False
        self.socket = FakeSocket(self, local, peer)

    # -- what the test does to its end -------------------------------------------

    def freeze(self) -> None:
        """From now on this end reads nothing and sends nothing (a hung process): its calls wait for ever."""
        self._frozen = True

    def reset(self) -> None:
        """Vanish with a reset, as ``SO_LINGER`` 0 then ``close`` does."""
        self._close(reset=True)

    def break_connection(self) -> None:
        """A middlebox (a relay, a NAT) resets the connection: both ends stay open and both see a reset."""
        self._connection.reset()

    def stall(self, *, sending: bool = True) -> None:
        """What this end sends (``sending=False``: what it receives) is held on its way until :meth:`unstall`."""
        (self._out if sending else self._in).stalled = True

    def unstall(self) -> None:
        """The stall is over: what was held arrives at once, in order."""
        self._out.stalled = self._in.stalled = False
        self._connection.changed.unpark_all()

    # -- trio.abc.HalfCloseableStream --------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._busy_send:
            raise trio.BusyResourceError("another task is writing to this stream")
        self._busy_send = True
        try:
            await trio.lowlevel.checkpoint()
            view = memoryview(bytes(data))
            while True:
                self._check_can_send()
                room = self._out.capacity - len(self._out.data)
                if room > 0 and view and not self._frozen:
                    self._out.data += view[:room]
                    view = view[room:]
                    self._connection.changed.unpark_all()
                if not view:
                    return
                await self._connection.changed.park()
        finally:
            self._busy_send = False

    async def wait_send_all_might_not_block(self) -> None:
        while (
            not self._closed
            and not self._connection.broken
            and not self._out.reader_gone
            and len(self._out.data) >= self._out.capacity
        ):
            await self._connection.changed.park()
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        if self._busy_send:
            raise trio.BusyResourceError("another task is writing to this stream")
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        if self._connection.broken:
            raise trio.BrokenResourceError("the connection was reset") from _reset()
        self._out.eof = True
        self._connection.changed.unpark_all()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._busy_receive:
            raise trio.BusyResourceError("another task is reading from this stream")
        self._busy_receive = True
        try:
            await trio.lowlevel.checkpoint()
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("this end is closed")
                if not self._frozen and not self._in.stalled:
                    if self._in.data:  # (after a reset too: these bytes had reached this side)
                        size = min(len(self._in.data), max_bytes or READ_BYTES)
                        chunk = bytes(self._in.data[:size])
                        del self._in.data[:size]
                        self._connection.changed.unpark_all()  # room for the writer
                        return chunk
                    if self._connection.broken:
                        raise trio.BrokenResourceError("the connection was reset") from _reset()
                    if self._in.eof:
                        return b""
                await self._connection.changed.park()
        finally:
            self._busy_receive = False

    async def aclose(self) -> None:
        self._close(reset=False)
        await trio.lowlevel.checkpoint()

    # -- inside --------------------------------------------------------------

    def _check_can_send(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        if self._connection.broken:
            raise trio.BrokenResourceError("the connection was reset") from _reset()
        if self._out.eof:
            raise trio.ClosedResourceError("this end has sent its EOF")
        if self._out.reader_gone:
            raise trio.BrokenResourceError("the peer closed the connection") from BrokenPipeError(
                errno.EPIPE, "Broken pipe"
            )

    def _close(self, *, reset: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if reset or self._in.data:  # unread bytes: TCP answers the close with a reset
            self._connection.reset()
            return
        self._out.eof = True
        self._in.reader_gone = True
        self._connection.changed.unpark_all()


class VirtualListener(trio.abc.Listener[VirtualStream]):
    """Hands the server the connections made to its address; ``socket`` says where it listens."""

    def __init__(self, network: VirtualNetwork, address: tuple[str, int], backlog: int):
        self._network = network
        self.address = address
        self.socket = _ListeningSocket(address)
        self._send, self._accept = trio.open_memory_channel[VirtualStream](backlog)

    async def accept(self) -> VirtualStream:
        try:
            return await self._accept.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise trio.ClosedResourceError("the listener is closed") from None

    async def aclose(self) -> None:
        self._network._forget(self)
        self._send.close()
        while True:  # connections never accepted are reset, as closing a listening socket does
            try:
                self._accept.receive_nowait()._close(reset=True)
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):  # (closed twice: nothing left)
                break
        self._accept.close()
        await trio.lowlevel.checkpoint()

    async def _deliver(self, stream: VirtualStream) -> None:
        await self._send.send(stream)


class _ListeningSocket:
    family = socket.AF_INET
    type = socket.SOCK_STREAM

    def __init__(self, address: tuple[str, int]):
        self._address = address

    def getsockname(self) -> tuple[str, int]:
        return self._address


class VirtualNetwork:
    """Listeners by address, and connections to them; ``buffer``: each direction's default capacity."""

    def __init__(self, buffer: int = DEFAULT_BUFFER):
        self.buffer = buffer
        self._listeners: dict[tuple[str, int], VirtualListener] = {}
        self._ports = itertools.count(40_000)  # ephemeral ports of the clients

    def listen(self, host: str = "127.0.0.1", port: int = 8998, *, backlog: int = 128) -> VirtualListener:
        if (host, port) in self._listeners:
            raise OSError(errno.EADDRINUSE, f"{host}:{port} is in use")
        listener = VirtualListener(self, (host, port), backlog)
        self._listeners[(host, port)] = listener
        return listener

    async def connect(
        self,
        host: str,
        port: int,
        *,
        source: str = "127.0.0.1",
        buffer: int | None = None,
        receive_buffer: int | None = None,
    ) -> VirtualStream:
        """A new connection from ``source`` (the client's end); ``buffer`` bytes each way, or
        ``receive_buffer`` for the direction towards the client (a small receive buffer, as ``SO_RCVBUF``)."""
        listener = self._listeners.get((host, port)) or self._listeners.get(("0.0.0.0", port))
        if listener is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"nothing listens on {host}:{port}")
        size = buffer or self.buffer
        connection = _Connection(to_server=size, to_client=receive_buffer or size)
        client = (source, next(self._ports))
        server = listener.address if listener.address[0] != "0.0.0.0" else (host, port)
        ours = VirtualStream(connection, connection.to_client, connection.to_server, client, server)
        theirs = VirtualStream(connection, connection.to_server, connection.to_client, server, client)
        await listener._deliver(theirs)
        return ours

    def _forget(self, listener: VirtualListener) -> None:
        if self._listeners.get(listener.address) is listener:
            del self._listeners[listener.address]
