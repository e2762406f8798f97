"""Where the Opus work of all sessions runs: child processes, a worker thread, or inline.

sphn's encoder holds the GIL for ~1.4 ms per 80 ms frame: on a 2-core machine
that caps a server near 50 real-time conversations (PERFORMANCE.md).  libopus
through ctypes (``_libopus``) is cheaper and releases the GIL, but a worker
thread must take the GIL back after each packet, and with a busy event loop
that wait dominates.  So by default each direction runs in a child process
(``_worker``) that shares no GIL, fed in batches: the event loop only packs
and unpacks bytes.  The thread and inline variants remain for comparison
(``bench/load.py``) and for machines without libopus.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import sphn
import trio

from ._libopus import SAMPLE_RATE, LibopusWriter, OpusWriter, libopus_available

logger = logging.getLogger(__name__)

def make_encoder_pool(kind: str) -> EncoderPool | ProcessEncoderPool:
    """``auto``: libopus in a child process when the system has libopus, else sphn."""
    if kind == "auto":
        kind = "process" if libopus_available() else "sphn"
    if kind == "process":
        return ProcessEncoderPool()
    return EncoderPool(kind)


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

    def __init__(self, kind: str = "libopus") -> None:
        self.kind = kind
        self._pending: list[_Job] = []
        self._wakeup = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self.batches = 0
        self.frames = 0

    def open_stream(self) -> OpusWriter:
        return make_writer(self.kind)

    def close_stream(self, stream: OpusWriter) -> None:
        pass

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


class CodecProcess:
    """Opus streams served by a child process (see ``_worker``), in batches.

    ``mode`` is ``encode`` (PCM in, Ogg pages out) or ``decode`` (Ogg bytes
    in, PCM out).  Sessions open a stream, then ``await process.run_item(...)``;
    whatever has gathered while the previous batch was away goes in the next
    one, so a busy server sends few large batches and an idle one answers at
    once.  If the child dies, the streams it held fail (their codec state is
    gone) and a new child serves new streams.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._pending: list[tuple[int, bytes, _ProcessJob]] = []
        self._closing: list[int] = []
        self._wakeup = trio.Event()
        self._next_stream = 0
        self._first_live_stream = 1  # streams below this died with an earlier child
        self.batches = 0
        self.items = 0

    def open_stream(self) -> int:
        self._next_stream += 1
        return self._next_stream

    def close_stream(self, stream: int) -> None:
        self._closing.append(stream)

    async def run_item(self, stream: int, payload: bytes) -> bytes:
        """Raises ``ValueError`` (the child's message) if the payload was bad for this stream."""
        if stream < self._first_live_stream:
            raise RuntimeError("this stream's Opus codec died with its process")
        job = _ProcessJob()
        self._pending.append((stream, payload, job))
        self._wakeup.set()
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        import subprocess
        import sys

        from ._worker import CLOSE, DATA, ERROR, READY, Unpacker, pack

        started = False
        while True:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "pplex_trio.codec._worker", self.mode],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )
            with trio.fail_after(60):
                if await process.stdout.receive_some(1) != READY:
                    raise RuntimeError(f"the Opus {self.mode} process did not start (see its errors above)")
            if not started:
                task_status.started()
                started = True
            unpacker = Unpacker()
            batch: list[tuple[int, bytes, _ProcessJob]] = []
            try:
                while True:
                    await self._wakeup.wait()
                    self._wakeup = trio.Event()
                    await trio.lowlevel.checkpoint()  # let the other sessions of this moment add theirs
                    batch, self._pending = self._pending, []
                    closing, self._closing = self._closing, []
                    if not batch and not closing:
                        continue
                    request = [(stream, DATA, payload) for stream, payload, _ in batch]
                    request += [(stream, CLOSE, b"") for stream in closing]
                    await process.stdin.send_all(pack(request))
                    if not batch:
                        continue  # closings get no answer
                    answer = None
                    while answer is None:
                        data = await process.stdout.receive_some(1 << 20)
                        if not data:
                            raise RuntimeError(f"the Opus {self.mode} process exited")
                        unpacker.feed(data)
                        answer = unpacker.next_message()
                    for (_, _, job), (_, kind, payload) in zip(batch, answer):
                        if kind == ERROR:
                            job.error = ValueError(payload.decode("utf-8", errors="replace"))
                        else:
                            job.result = payload
                        job.done.set()
                    self.batches += 1
                    self.items += len(batch)
            except (RuntimeError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                logger.error("Opus %s process failed (%s); starting a new one", self.mode, exc)
                self._first_live_stream = self._next_stream + 1
                for _, _, job in batch + self._pending:
                    job.error = RuntimeError(f"the Opus {self.mode} process failed")
                    job.done.set()
                self._pending = []
            finally:
                with trio.CancelScope(shield=True):
                    await process.stdin.aclose()
                    with trio.move_on_after(2):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()


class ProcessEncoderPool:
    """The encoder pool interface over an encoding :class:`CodecProcess`."""

    def __init__(self) -> None:
        self.process = CodecProcess("encode")
        self.run = self.process.run
        self.open_stream = self.process.open_stream
        self.close_stream = self.process.close_stream

    async def encode(self, stream: int, pcm: np.ndarray) -> bytes:
        return await self.process.run_item(stream, np.ascontiguousarray(pcm, dtype="<f4").tobytes())


class ProcessDecoderPool:
    """Ogg Opus decoding in a child process (see :class:`CodecProcess`)."""

    def __init__(self) -> None:
        self.process = CodecProcess("decode")
        self.run = self.process.run
        self.open_stream = self.process.open_stream
        self.close_stream = self.process.close_stream

    async def decode(self, stream: int, ogg: bytes) -> np.ndarray:
        return np.frombuffer(await self.process.run_item(stream, ogg), dtype="<f4")


class InlineDecoderPool:
    """sphn's decoder on the event loop (~0.1 ms a page): for small servers and tests."""

    def open_stream(self) -> sphn.OpusStreamReader:
        return sphn.OpusStreamReader(SAMPLE_RATE)

    def close_stream(self, stream: sphn.OpusStreamReader) -> None:
        pass

    async def decode(self, stream: sphn.OpusStreamReader, ogg: bytes) -> np.ndarray:
        await trio.lowlevel.checkpoint()
        return stream.append_bytes(ogg)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()


def make_decoder_pool(kind: str) -> ProcessDecoderPool | InlineDecoderPool:
    """``process`` (a child process) or ``inline`` (sphn on the event loop); ``auto`` = process."""
    return InlineDecoderPool() if kind == "inline" else ProcessDecoderPool()


class _ProcessJob:
    __slots__ = ("result", "error", "done")

    def __init__(self) -> None:
        self.result = b""
        self.error: Exception | None = None
        self.done = trio.Event()
