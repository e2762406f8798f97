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

The wire format is ``_encoder_wire.py``'s.

Run as ``python -m pplex_trio.codec._worker``.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from ._encoder_wire import CLOSE, DATA, ERROR, READ_BYTES, READY, Unpacker, pack

if TYPE_CHECKING:
    from ._libopus import OpusWriter


def _encoder() -> tuple[Callable[[], OpusWriter], Callable[[OpusWriter, bytes], bytes]]:
    import numpy as np

    from ._libopus import LibopusWriter

    return LibopusWriter, lambda writer, pcm: writer.append_pcm(np.frombuffer(pcm, dtype="<f4"))


FLUSH_AFTER = 0.001  # s: the longest a ready answer waits for the ones after it


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
