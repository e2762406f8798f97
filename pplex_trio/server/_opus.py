"""Opus encoding of a session's output: libopus through ctypes, or sphn.

sphn's ``OpusStreamWriter`` holds the GIL for its whole ~1.4 ms encode of an
80 ms frame, and runs at libopus' highest complexity: on a 2-core machine that
caps a server near 50 real-time conversations (PERFORMANCE.md).  Calling
libopus directly (``opuslib_next``, ctypes over the system's libopus) lets us
pick complexity 5 (~0.3 ms a frame) and releases the GIL while it encodes, so
the encoding of many sessions can run on a worker thread beside the event
loop.  Both writers produce the same wire format: an Ogg Opus stream at
24 kHz, one 40 ms packet per page, header pages first.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import sphn
import trio

from ..engine import SAMPLE_RATE
from ..protocol._ogg import OggOpusMuxer

logger = logging.getLogger(__name__)

PACKET_SAMPLES = SAMPLE_RATE // 25  # 40 ms: one packet per page, two pages per frame, as sphn writes
COMPLEXITY = 5
BITRATE = 32_000


class OpusWriter(Protocol):
    def append_pcm(self, pcm: np.ndarray) -> bytes:
        """Encode float32 mono PCM (a multiple of 20 ms); return whole Ogg pages."""


class LibopusWriter:
    """libopus (ctypes) + our Ogg muxer."""

    def __init__(self) -> None:
        import opuslib_next

        self._encoder = opuslib_next.Encoder(SAMPLE_RATE, 1, opuslib_next.APPLICATION_AUDIO)
        self._encoder.complexity = COMPLEXITY
        self._encoder.bitrate = BITRATE
        pre_skip = self._encoder.lookahead * (48_000 // SAMPLE_RATE)
        self._muxer = OggOpusMuxer(input_rate=SAMPLE_RATE, pre_skip_48k=pre_skip)

    def append_pcm(self, pcm: np.ndarray) -> bytes:
        data = np.ascontiguousarray(pcm, dtype=np.float32)
        packets = [
            self._encoder.encode_float(data[i : i + PACKET_SAMPLES].tobytes(), PACKET_SAMPLES)
            for i in range(0, data.size - PACKET_SAMPLES + 1, PACKET_SAMPLES)
        ]
        return self._muxer.pages(packets, samples_48k_per_packet=PACKET_SAMPLES * 48_000 // SAMPLE_RATE, per_page=1)


def libopus_available() -> bool:
    try:
        LibopusWriter()
    except Exception as exc:  # opuslib_next raises a bare Exception when libopus is missing
        logger.debug("libopus not usable: %s", exc)
        return False
    return True


def make_writer(kind: str) -> OpusWriter:
    """``libopus``, ``sphn``, or ``auto`` (libopus when the system has it)."""
    if kind == "sphn":
        return sphn.OpusStreamWriter(SAMPLE_RATE)
    if kind in ("libopus", "auto"):
        try:
            return LibopusWriter()
        except Exception:
            if kind == "libopus":
                raise
    return sphn.OpusStreamWriter(SAMPLE_RATE)


class EncoderPool:
    """Runs the Opus encodes of all sessions on one worker thread, in batches.

    After each tick every live session has one frame to encode.  Sessions
    hand theirs to :meth:`encode` and wait; the pool's task takes whatever has
    gathered and encodes it in one ``trio.to_thread`` call, so the event loop
    keeps receiving and sending while libopus works (it releases the GIL), at
    the cost of a few thread hops per tick instead of one per frame.
    """

    def __init__(self) -> None:
        self._pending: list[_Job] = []
        self._wakeup = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self.batches = 0
        self.frames = 0

    async def encode(self, writer: OpusWriter, pcm: np.ndarray) -> bytes:
        job = _Job(writer, pcm)
        self._pending.append(job)
        self._wakeup.set()
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            await trio.lowlevel.checkpoint()  # let the other sessions of this tick add theirs
            batch, self._pending = self._pending, []
            if not batch:
                continue
            await trio.to_thread.run_sync(_encode_all, batch, limiter=self._limiter)
            self.batches += 1
            self.frames += len(batch)
            for job in batch:
                job.done.set()


class _Job:
    __slots__ = ("writer", "pcm", "result", "error", "done")

    def __init__(self, writer: OpusWriter, pcm: np.ndarray):
        self.writer, self.pcm = writer, pcm
        self.result = b""
        self.error: Exception | None = None
        self.done = trio.Event()


def _encode_all(batch: list[_Job]) -> None:
    for job in batch:
        try:
            job.result = job.writer.append_pcm(job.pcm)
        except Exception as exc:  # one session's failure is that session's
            job.error = exc
