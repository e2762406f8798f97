"""The Opus encoder process: every session's output encoding, away from the event loop.

Why a process: libopus through ctypes releases the GIL while it encodes, but
a worker *thread* must take the GIL back after every packet, and with the
event loop busy that wait, not the codec, dominates (measured: 48 frames took
75 ms instead of 16).  A child process shares no GIL: the event loop only
packs and unpacks bytes.

The child keeps one :class:`LibopusWriter` per stream.  The parent sends a
batch of items; the child answers each DATA item with a message of one item,
and writes the answers out at most :data:`FLUSH_AFTER` after the first of them
was ready (and whenever it has nothing left to encode), so the first session
of a tick does not wait for the last one's encode, and the parent wakes once
per few answers, not once per answer.  Answers come in the order of the items.
The format below is sans-IO, so both ends and the tests share it.

Wire format, little-endian: ``u32 count``, then ``count`` items of
``u32 stream, u32 kind, u32 length, payload``.  Request kinds: DATA (PCM to
encode) and CLOSE (forget the stream).  Answer kinds: DATA (the Ogg pages)
and ERROR (a UTF-8 message: the stream's input was bad; the stream is
forgotten).

Run as ``python -m pplex_trio.codec._worker``.
"""

from __future__ import annotations

import signal
import struct
import sys
import time
from typing import TYPE_CHECKING, BinaryIO, Callable

if TYPE_CHECKING:
    from ._libopus import OpusWriter

_HEADER = struct.Struct("<I")
_ITEM = struct.Struct("<III")
DATA, CLOSE, ERROR = 0, 1, 2
READY = b"R"  # the child's first byte: its imports are done, it takes batches

Item = tuple[int, int, bytes]  # (stream, kind, payload)


def pack(items: list[Item]) -> bytes:
    parts = [_HEADER.pack(len(items))]
    for stream, kind, payload in items:
        parts.append(_ITEM.pack(stream, kind, len(payload)))
        parts.append(payload)
    return b"".join(parts)


class Unpacker:
    """Incremental parser: feed bytes, take whole messages.

    It remembers how many bytes the message in progress needs at least, so a
    large answer arriving in many small reads is parsed once, not once per read.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need = _HEADER.size

    def feed(self, data: bytes | bytearray) -> None:
        self._buf += data

    def next_message(self) -> list[Item] | None:
        buf = self._buf
        if len(buf) < self._need:
            return None
        (count,) = _HEADER.unpack_from(buf, 0)
        pos, items = _HEADER.size, []
        view = memoryview(buf)
        try:
            for _ in range(count):
                if len(buf) < pos + _ITEM.size:
                    self._need = pos + _ITEM.size
                    return None
                stream, kind, length = _ITEM.unpack_from(buf, pos)
                pos += _ITEM.size
                if len(buf) < pos + length:
                    self._need = pos + length
                    return None
                items.append((stream, kind, bytes(view[pos : pos + length])))
                pos += length
        finally:
            view.release()
        del buf[:pos]
        self._need = _HEADER.size
        return items


def _encoder() -> tuple[Callable[[], OpusWriter], Callable[[OpusWriter, bytes], bytes]]:
    import numpy as np

    from ._libopus import LibopusWriter

    return LibopusWriter, lambda writer, pcm: writer.append_pcm(np.frombuffer(pcm, dtype="<f4"))


FLUSH_AFTER = 0.001  # s: the longest a ready answer waits for the ones after it
# Bytes asked of the pipe per read, on both ends.  Python allocates that much for every read, and
# above glibc's mmap threshold (128 KiB) that is an mmap and a munmap: reading 3 KB with a 1 MiB
# limit took 16 µs against 1 µs with 64 KiB.  A tick's larger batch takes a few reads.
READ_BYTES = 1 << 16


def serve(stdin: BinaryIO, stdout: BinaryIO, *, clock: Callable[[], float] = time.monotonic) -> None:
    """Answer every DATA item, in order, until stdin closes."""
    make, work = _encoder()
    make()  # fail now (e.g. no libopus), not on the first batch
    states: dict[int, OpusWriter] = {}
    unpacker = Unpacker()
    stdout.write(READY)
    stdout.flush()
    # Answers wait here, not in stdout's buffer: with PYTHONUNBUFFERED (set in many container
    # images, ours too) stdout would write each one at once and wake the parent once per answer.
    unsent = bytearray()
    first_ready: float | None = None  # when the oldest answer in ``unsent`` was ready

    def flush() -> None:
        nonlocal first_ready
        if unsent:
            stdout.write(unsent)
            stdout.flush()
            unsent.clear()
            first_ready = None

    while True:
        data = stdin.read1(READ_BYTES)  # type: ignore[attr-defined]  # typing.BinaryIO lacks read1; stdin.buffer has it
        if not data:
            flush()
            return
        unpacker.feed(data)
        while (batch := unpacker.next_message()) is not None:
            for stream, kind, payload in batch:
                if kind == CLOSE:  # closings get no answer
                    states.pop(stream, None)
                    continue
                state = states.get(stream)
                if state is None:
                    state = states[stream] = make()
                try:
                    answer = (stream, DATA, work(state, payload))
                except Exception as exc:  # one stream's bad input fails that stream, never the child
                    states.pop(stream, None)
                    answer = (stream, ERROR, f"{type(exc).__name__}: {exc}".encode())
                unsent += pack([answer])
                now = clock()
                if first_ready is None:
                    first_ready = now
                elif now - first_ready >= FLUSH_AFTER:
                    flush()
        flush()  # nothing more to encode until the parent sends more


if __name__ == "__main__":
    # Ctrl-C in a terminal reaches the whole process group, and systemd sends SIGTERM to every
    # process of the service: the parent owns shutdown (and may drain for a while first), and
    # this child ends when the parent closes its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # A buffered stdout of our own: it writes each group whole (PYTHONUNBUFFERED makes
    # sys.stdout.buffer a raw file, whose write may take only part of it).
    serve(sys.stdin.buffer, open(sys.stdout.fileno(), "wb", closefd=False))
