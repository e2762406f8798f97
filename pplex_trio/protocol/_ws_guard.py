"""A sans-IO guard on a client's byte stream: HTTP request heads, then WebSocket frame headers.

hypercorn buffers a WebSocket message until it is complete and checks its size
only as the data arrives: a frame header that claims a gigabyte is waited on,
and after its own 1009 it goes on buffering a client's endless fragments.  It
also accepts ``permessage-deflate``, under which a small frame can inflate to
gigabytes.  This guard sits below it and follows the bytes the client sends:

* request heads: at most ``max_head_bytes`` (``Sec-WebSocket-Extensions`` is
  taken out, so no compression is ever negotiated: the audio is compressed
  already, and compressed frames could not be bounded before inflating);
* once the server has answered an upgrade with 101, frame headers: a data
  message whose frames claim more than ``max_message_bytes`` in all is refused
  the moment its header arrives, before its payload is read.

Bytes in, bytes (or a refusal) out; no sockets.  Request bodies are skipped by
``Content-Length``; a chunked body is refused (411): the one route that takes a
body (a voice upload) needs its length, and following chunks would leave a way
around the guard.
"""

from __future__ import annotations

import dataclasses
import enum

from .._conversation import CloseCode

MAX_HEAD_BYTES = 16 * 1024
_HEAD_END = b"\r\n\r\n"


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why the connection is refused: an HTTP status before the upgrade, else a close code."""

    reason: str
    http_status: int | None = None
    close_code: CloseCode | None = None


class _Reading(enum.Enum):
    HEAD = "head"  # reading a request head
    BODY = "body"  # skipping a request body
    UPGRADING = "upgrading"  # an upgrade request came; the server has not answered yet
    FRAMES = "frames"  # WebSocket frames


_WAIT = object()  # a step needs more bytes before it can go on


class InboundGuard:
    """Feed the client's bytes to :meth:`inbound`, and the server's to :meth:`outbound` before they go out."""

    def __init__(self, max_message_bytes: int, *, max_head_bytes: int = MAX_HEAD_BYTES):
        self.max_message_bytes = max_message_bytes
        self.max_head_bytes = max_head_bytes
        self._reading = _Reading.HEAD
        self._buffer = bytearray()  # an incomplete request head or frame header
        self._skip = 0  # body or frame payload bytes still to pass
        self._message = 0  # payload bytes of the data message in progress

    @property
    def websocket(self) -> bool:
        """Whether the connection has become a WebSocket (the guard now reads frames, not HTTP requests)."""
        return self._reading is _Reading.FRAMES

    def inbound(self, data: bytes | bytearray) -> tuple[bytes, Refusal | None]:
        """What to pass on of the client's ``data`` (maybe rewritten), and a refusal if it broke a limit."""
        self._buffer += data
        return self._run()

    def outbound(self, data: bytes) -> None:
        """The server's ``data`` is about to go out: an answer to an upgrade decides what follows."""
        if self._reading is _Reading.UPGRADING:
            # 101: frames follow; anything else refused the upgrade and the connection goes on as HTTP.
            self._reading = _Reading.FRAMES if data.startswith(b"HTTP/1.1 101") else _Reading.HEAD

    def _run(self) -> tuple[bytes, Refusal | None]:
        out = bytearray()
        while self._buffer:
            if self._skip:
                take = min(self._skip, len(self._buffer))
                out += self._buffer[:take]
                del self._buffer[:take]
                self._skip -= take
                if not self._skip and self._reading is _Reading.BODY:
                    self._reading = _Reading.HEAD
                continue
            if self._reading is _Reading.UPGRADING:  # RFC 6455 4.1: a client waits for the answer
                return bytes(out), Refusal("data sent before the upgrade was answered", http_status=400)
            step = self._head(out) if self._reading in (_Reading.HEAD, _Reading.BODY) else self._frame_header(out)
            if step is _WAIT:
                break
            if isinstance(step, Refusal):
                return bytes(out), step
        return bytes(out), None

    # -- steps ---------------------------------------------------------------

    def _head(self, out: bytearray) -> object:
        end = self._buffer.find(_HEAD_END)
        if end < 0 or end + len(_HEAD_END) > self.max_head_bytes:
            if end < 0 and len(self._buffer) <= self.max_head_bytes:
                return _WAIT
            return Refusal(f"request head over {self.max_head_bytes} bytes", http_status=431)
        end += len(_HEAD_END)
        lines = bytes(self._buffer[:end]).split(b"\r\n")
        del self._buffer[:end]
        kept = [lines[0]]
        upgrade, length = False, 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"sec-websocket-extensions":
                continue  # no compression, ever (see the module docstring)
            if name == b"upgrade" and value == b"websocket":
                upgrade = True
            elif name == b"content-length":
                if not value.isdigit():
                    return Refusal("bad Content-Length", http_status=400)
                length = int(value)
            elif name == b"transfer-encoding":
                return Refusal("a chunked request body (send its Content-Length)", http_status=411)
            kept.append(line)
        out += b"\r\n".join(kept)
        if upgrade:
            self._reading = _Reading.UPGRADING
        elif length:
            self._reading, self._skip = _Reading.BODY, length
        return None

    def _frame_header(self, out: bytearray) -> object:
        buf = self._buffer
        if len(buf) < 2:
            return _WAIT
        first, second = buf[0], buf[1]
        size = second & 0x7F
        need = 2 + (2 if size == 126 else 8 if size == 127 else 0) + (4 if second & 0x80 else 0)
        if len(buf) < need:
            return _WAIT
        if size == 126:
            size = int.from_bytes(buf[2:4], "big")
        elif size == 127:
            size = int.from_bytes(buf[2:10], "big")
        opcode = first & 0x0F
        if opcode < 8:  # a data frame: 0 continues a message, 1 and 2 start one
            self._message = size if opcode else self._message + size
            if self._message > self.max_message_bytes:
                return Refusal(
                    f"message over the limit of {self.max_message_bytes} bytes", close_code=CloseCode.MESSAGE_TOO_BIG
                )
        out += buf[:need]
        del buf[:need]
        self._skip = size
        return None
