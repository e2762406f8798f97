"""The encoder child's wire format, sans-IO: both ends (``_worker.py``, ``server/_encoders.py``) and the tests share it.

Little-endian: ``u32 count``, then ``count`` items of ``u32 stream, u32 kind,
u32 length, payload``.  Request kinds: DATA (PCM to encode) and CLOSE (forget
the stream).  Answer kinds: DATA (the Ogg pages) and ERROR (a UTF-8 message:
the stream's input was bad; the stream is forgotten).  The child's first byte
is READY.
"""

from __future__ import annotations

import struct

_HEADER = struct.Struct("<I")
_ITEM = struct.Struct("<III")
DATA, CLOSE, ERROR = 0, 1, 2
READY = b"R"  # the child's first byte: its imports are done, it takes batches

Item = tuple[int, int, bytes]  # (stream, kind, payload)


def pack(items: list[Item]) -> bytes:
    """One message of ``items`` (stream, kind, payload) in the wire format of the module docstring."""
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
        """Append bytes read from the pipe; :meth:`next_message` parses them."""
        self._buf += data

    def next_message(self) -> list[Item] | None:
        """The next whole message's items, consumed from the buffer; ``None`` until all its bytes have arrived."""
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


# Bytes asked of the pipe per read, on both ends.  Python allocates that much for every read, and
# above glibc's mmap threshold (128 KiB) that is an mmap and a munmap: reading 3 KB with a 1 MiB
# limit took 16 µs against 1 µs with 64 KiB.  A tick's larger batch takes a few reads.
READ_BYTES = 1 << 16
