"""Where the Opus work of all sessions runs: child processes, a worker thread, or inline.

sphn's encoder holds the GIL for ~1.4 ms per 80 ms frame: on a 2-core machine
that caps a server near 50 real-time conversations (PERFORMANCE.md).  libopus
through ctypes (``_libopus``) is cheaper and releases the GIL, but a worker
thread must take the GIL back after each packet, and with a busy event loop
that wait dominates.  So by default encoding runs in a child process
(``_worker``) that shares no GIL, fed in batches: the event loop only packs
and unpacks bytes.  Decoding stays on the event loop: sphn's decoder costs
~0.07 ms of CPU a page, and a decoding child was measured to cost the event
loop nearly as much in packing, pipe traffic and wake-ups, while adding a
round trip of latency.  The thread variants remain for comparison
(``bench/load.py``) and for machines without libopus.
"""

from __future__ import annotations

import collections
import logging
import subprocess
import sys

import numpy as np
import sphn
import trio

from ._libopus import SAMPLE_RATE, LibopusWriter, OpusWriter, libopus_available
from ._worker import CLOSE, DATA, ERROR, READY, Unpacker, pack

logger = logging.getLogger(__name__)

def make_encoder_pool(kind: str, inline_streams: int = 0) -> EncoderPool | ProcessEncoderPool:
    """``auto``: libopus in a child process when the system has libopus, else sphn.

    With the child process, the first ``inline_streams`` conversations at a
    time encode on the event loop instead (see :class:`ProcessEncoderPool`).
    """
    if kind == "auto":
        kind = "process" if libopus_available() else "sphn"
    if kind == "process":
        return ProcessEncoderPool(inline_streams=inline_streams)
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

    async def encode_many(self, writer: OpusWriter, frames: list[np.ndarray]) -> list[bytes]:
        return [await self.encode(writer, pcm) for pcm in frames]

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


class EncoderProcess:
    """Opus encoder streams served by a child process (see ``_worker``), in batches.

    PCM goes in, Ogg pages come out.  Sessions open a stream and hand over
    items with :meth:`run_items`; a writer task sends whatever has gathered
    as one batch, without waiting for earlier answers, and a reader task
    matches the answers, which come item by item as the child finishes them,
    to items in order.  So throughput does not depend on how long a round
    trip takes on a busy event loop.  If the child dies, the streams it held
    fail (their encoder state is gone) and a new child serves new streams.
    """

    def __init__(self) -> None:
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
        self._wakeup.set()

    async def run_items(self, stream: int, payloads: list[bytes]) -> list[bytes]:
        """Process ``payloads`` in order on ``stream``.

        Raises ``ValueError`` (the child's message) if one was bad for this stream.
        """
        if stream < self._first_live_stream:
            raise RuntimeError("this stream's Opus encoder died with its process")
        job = _ProcessJob(len(payloads))
        self._pending.extend((stream, payload, (job, i)) for i, payload in enumerate(payloads))
        self._wakeup.set()
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.results

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "pplex_trio.codec._worker"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )
            in_flight: collections.deque[tuple[_ProcessJob, int]] = collections.deque()
            try:
                with trio.fail_after(60):
                    if await process.stdout.receive_some(1) != READY:
                        raise RuntimeError("it did not start (see its errors above)")
                if not started:
                    task_status.started()
                    started = True
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_batches, process, in_flight)
                    nursery.start_soon(self._read_answers, process, in_flight)
            except (RuntimeError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                logger.error("Opus encoder process failed (%s); starting a new one", exc)
                self._first_live_stream = self._next_stream + 1
                failed = [job for job, _ in in_flight] + [job for _, _, (job, _) in self._pending]
                for job in failed:
                    job.fail(RuntimeError("the Opus encoder process failed"))
                self._pending = []
            finally:
                with trio.CancelScope(shield=True):
                    await process.stdin.aclose()
                    with trio.move_on_after(2):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()

    async def _write_batches(self, process: trio.Process, in_flight: collections.deque[tuple[_ProcessJob, int]]) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            await trio.lowlevel.checkpoint()  # let the other sessions of this moment add theirs
            batch, self._pending = self._pending, []
            closing, self._closing = self._closing, []
            request = [(stream, DATA, payload) for stream, payload, _ in batch]
            request += [(stream, CLOSE, b"") for stream in closing]
            if not request:
                continue
            in_flight.extend(job for _, _, job in batch)  # closings get no answer
            # One message per item: the child starts on the first frame while the rest are in the pipe.
            await process.stdin.send_all(b"".join(pack([item]) for item in request))
            self.batches += 1
            self.items += len(batch)

    async def _read_answers(self, process: trio.Process, in_flight: collections.deque[tuple[_ProcessJob, int]]) -> None:
        unpacker = Unpacker()
        while True:
            data = await process.stdout.receive_some(1 << 20)
            if not data:
                raise RuntimeError("it exited")
            unpacker.feed(data)
            while (answer := unpacker.next_message()) is not None:
                for _, kind, payload in answer:
                    job, index = in_flight.popleft()
                    if kind == ERROR:
                        job.fail(ValueError(payload.decode("utf-8", errors="replace")))
                    else:
                        job.deliver(index, payload)


class ProcessEncoderPool:
    """The encoder pool interface over an encoding :class:`EncoderProcess`.

    A frame's trip to the child and back costs ~2 ms of pipe traffic and
    wake-ups for ~0.4 ms of encoding: on a lightly loaded server that is most
    of the latency left after the tick.  So up to ``inline_streams``
    conversations at a time encode on the event loop instead (libopus, ~0.4 ms
    of the loop per frame each: at most ``inline_streams`` x 0.4 ms a tick).
    A stream keeps its place for life: an encoder's state cannot move between
    processes.
    """

    def __init__(self, inline_streams: int = 0) -> None:
        self.process = EncoderProcess()
        self.run = self.process.run
        self.inline_streams = inline_streams
        self.inline_open = 0

    def open_stream(self) -> int | LibopusWriter:
        if self.inline_open < self.inline_streams:
            self.inline_open += 1
            return LibopusWriter()
        return self.process.open_stream()

    def close_stream(self, stream: int | LibopusWriter) -> None:
        if isinstance(stream, LibopusWriter):
            self.inline_open -= 1
        else:
            self.process.close_stream(stream)

    async def encode_many(self, stream: int | LibopusWriter, frames: list[np.ndarray]) -> list[bytes]:
        if isinstance(stream, LibopusWriter):
            return [stream.append_pcm(pcm) for pcm in frames]
        payloads = [np.ascontiguousarray(pcm, dtype="<f4").tobytes() for pcm in frames]
        return await self.process.run_items(stream, payloads)


class _ProcessJob:
    """The items one ``run_items`` call handed over, and one event for all of them."""

    __slots__ = ("results", "left", "error", "done")

    def __init__(self, count: int):
        self.results: list[bytes] = [b""] * count
        self.left = count
        self.error: Exception | None = None
        self.done = trio.Event()

    def deliver(self, index: int, payload: bytes) -> None:
        self.results[index] = payload
        self.left -= 1
        if self.left == 0:
            self.done.set()

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self.done.set()
