"""Where the Opus encoding of all Moshi sessions runs: a child process, or the event loop.

sphn's encoder holds the GIL for ~1.4 ms per 80 ms frame: on a 2-core machine
that caps a server near 50 real-time conversations.  libopus through ctypes
(``codec/_libopus.py``) is cheaper and releases the GIL, but a worker thread
must take the GIL back after each packet, and with a busy event loop that wait
dominates.  So by default encoding runs in a child process
(``codec/_worker.py``) that shares no GIL, fed in batches: the event loop only
packs and unpacks bytes, and the first few conversations encode inline to
spare them the trip.  Decoding stays on the event loop: sphn's decoder costs
~0.07 ms of CPU a page, and a decoding child was measured to cost the event
loop nearly as much in packing, pipe traffic and wake-ups, while adding a
round trip of latency (``docs/BENCHMARKS.md``).

Every placement offers the same four calls (:class:`Encoders`), so the Moshi
protocol does not know which one it has.  The worker-thread placements that
were measured against these live in ``bench/``, not here.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import subprocess
import sys
from typing import Any, Protocol

import numpy as np
import trio

from ..codec import LibopusWriter, OpusWriter, encoder_wire, libopus_available, make_writer
from ._setting_types import OpusEncoderPlacement

logger = logging.getLogger(__name__)


class Encoders(Protocol):
    """Per-conversation Opus streams, wherever they run."""

    def open_stream(self) -> Any:
        """A new Opus stream for one conversation: a handle for the calls below."""

    def close_stream(self, stream: Any) -> None:
        """Forget ``stream``; its conversation has ended."""

    async def encode_many(self, stream: Any, frames: list[np.ndarray]) -> list[bytes]:
        """Encode 24 kHz float32 ``frames`` on ``stream``, in order: each frame's Ogg pages (the headers first)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the streams until cancelled (a child process's, where there is one); started once it can."""


NO_LIBOPUS = (
    "CAPACITY WARNING: this system has no libopus, so the Opus output of /api/chat is encoded by sphn on the "
    "event loop, which holds it ~1.4 ms per frame and conversation: on 2 cores the load test holds 48 "
    "conversations at real time with libopus and none without. Install it (Debian/Ubuntu: apt-get install "
    "libopus0; Fedora: dnf install opus; macOS: brew install opus) and restart; /v1/realtime and "
    "/v1/audio/duplex do not need it"
)


def make_encoders(placement: OpusEncoderPlacement, inline_streams: int = 0) -> Encoders:
    """``auto``: libopus in a child process when the system has libopus, else sphn (with a warning)."""
    if placement is OpusEncoderPlacement.AUTO:
        if libopus_available():
            placement = OpusEncoderPlacement.PROCESS
        else:
            logger.warning(NO_LIBOPUS)
            placement = OpusEncoderPlacement.SPHN
    if placement is OpusEncoderPlacement.PROCESS:
        return ProcessEncoderPool(inline_streams=inline_streams)
    return InlineEncoders("sphn" if placement is OpusEncoderPlacement.SPHN else "libopus")


class InlineEncoders:
    """Every stream encodes on the event loop, as its frames come."""

    def __init__(self, kind: str = "libopus") -> None:
        self.kind = kind

    def open_stream(self) -> OpusWriter:
        """A new writer of the chosen kind (libopus or sphn)."""
        return make_writer(self.kind)

    def close_stream(self, stream: OpusWriter) -> None:
        """Nothing to release: the writer goes with its session."""
        pass

    async def encode_many(self, stream: OpusWriter, frames: list[np.ndarray]) -> list[bytes]:
        """Each frame's Ogg pages, encoded here on the event loop."""
        return [stream.append_pcm(pcm) for pcm in frames]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Nothing to serve: reports started at once and returns."""
        task_status.started()


class EncoderProcess:
    """Opus encoder streams served by a child process (see ``codec/_worker.py``), in batches.

    PCM goes in, Ogg pages come out.  Sessions open a stream and hand over
    items with :meth:`run_items`; a writer task sends whatever has gathered
    as one batch, without waiting for earlier answers, and a reader task
    matches the answers, which come a few at a time as the child finishes them
    (the first of a group waits at most 1 ms), to items in order.  So
    throughput does not depend on how long a round trip takes on a busy event
    loop.  If the child dies, the streams it held
    fail (their encoder state is gone) and a new child serves new streams.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[int, bytes, tuple[_ProcessJob, int]]] = []  # (stream, PCM, (job, item))
        self._closing: list[int] = []
        self._wakeup = trio.Event()
        self._next_stream = 0
        self._first_live_stream = 1  # streams below this died with an earlier child
        self.batches = 0
        self.items = 0

    def open_stream(self) -> int:
        """A new stream number on the child; the child creates its encoder with the stream's first item."""
        self._next_stream += 1
        return self._next_stream

    def close_stream(self, stream: int) -> None:
        """Tell the child to forget ``stream`` with the next batch."""
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
        """Run the child and its writer and reader tasks until cancelled, starting a new child when one fails (its
        streams' items fail with ``RuntimeError``); started once the first child is ready (``RuntimeError`` if it is
        not within 60 s).
        """
        started = False
        while True:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "pplex_trio.codec._worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            in_flight: collections.deque[tuple[_ProcessJob, int]] = collections.deque()
            stdin, stdout = process.stdin, process.stdout
            assert stdin is not None and stdout is not None  # opened with PIPE
            _widen_pipe(stdin)
            try:
                with trio.fail_after(60):
                    if await stdout.receive_some(1) != encoder_wire.READY:
                        raise RuntimeError("it did not start (see its errors above)")
                if not started:
                    task_status.started()
                    started = True
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_batches, stdin, in_flight)
                    nursery.start_soon(self._read_answers, stdout, in_flight)
            except (RuntimeError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                logger.error("Opus encoder process failed (%s); starting a new one", exc)
                self._first_live_stream = self._next_stream + 1
                failed = [job for job, _ in in_flight] + [job for _, _, (job, _) in self._pending]
                for job in failed:
                    job.fail(RuntimeError("the Opus encoder process failed"))
                self._pending = []
            finally:
                with trio.CancelScope(shield=True):
                    await stdin.aclose()
                    with trio.move_on_after(1):  # shutdown is bounded: a child that lingers is killed
                        await process.wait()
                    if process.returncode is None:
                        process.kill()

    async def _write_batches(
        self, stdin: trio.abc.SendStream, in_flight: collections.deque[tuple[_ProcessJob, int]]
    ) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            await trio.lowlevel.checkpoint()  # let the other sessions of this moment add theirs
            batch, self._pending = self._pending, []
            closing, self._closing = self._closing, []
            request = [(stream, encoder_wire.DATA, payload) for stream, payload, _ in batch]
            request += [(stream, encoder_wire.CLOSE, b"") for stream in closing]
            if not request:
                continue
            in_flight.extend(job for _, _, job in batch)  # closings get no answer
            # One message per item: the child starts on the first frame while the rest are in the pipe.
            await stdin.send_all(b"".join(encoder_wire.pack([item]) for item in request))
            self.batches += 1
            self.items += len(batch)

    async def _read_answers(
        self, stdout: trio.abc.ReceiveStream, in_flight: collections.deque[tuple[_ProcessJob, int]]
    ) -> None:
        unpacker = encoder_wire.Unpacker()
        while True:
            data = await stdout.receive_some(encoder_wire.READ_BYTES)
            if not data:
                raise RuntimeError("it exited")
            unpacker.feed(data)
            while (answer := unpacker.next_message()) is not None:
                for _, kind, payload in answer:
                    job, index = in_flight.popleft()
                    if kind == encoder_wire.ERROR:
                        job.fail(ValueError(payload.decode("utf-8", errors="replace")))
                    else:
                        job.deliver(index, payload)


PIPE_BYTES = 1 << 20  # a tick's frames for 64 conversations are 0.5 MB of PCM


def _widen_pipe(stream: trio.abc.SendStream) -> None:
    """Let a tick's whole batch into the pipe in one write (Linux's 64 KiB default takes 8 frames, so each
    batch took a dozen writes, each waiting for the child to read)."""
    command = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if command is None or not isinstance(stream, trio.lowlevel.FdStream):
        return
    try:
        fcntl.fcntl(stream.fileno(), command, PIPE_BYTES)
    except OSError as exc:  # above /proc/sys/fs/pipe-max-size: the default still works, in more writes
        logger.debug("the encoder pipe keeps its default size (%s)", exc)


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
        """A libopus writer on the event loop while fewer than ``inline_streams`` are open, else a stream of the
        child."""
        if self.inline_open < self.inline_streams:
            self.inline_open += 1
            return LibopusWriter()
        return self.process.open_stream()

    def close_stream(self, stream: int | LibopusWriter) -> None:
        """Free the stream's place: an inline one, or the child's."""
        if isinstance(stream, LibopusWriter):
            self.inline_open -= 1
        else:
            self.process.close_stream(stream)

    async def encode_many(self, stream: int | LibopusWriter, frames: list[np.ndarray]) -> list[bytes]:
        """Each frame's Ogg pages: encoded here for an inline stream, else by the child."""
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
