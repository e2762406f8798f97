"""The worker-thread Opus encoder placement, kept for comparison benchmarks only.

The server encodes in a child process or on the event loop
(``pplex_trio/server/_encoders.py``); this variant (one worker thread, in
batches) was measured against them and lost (``docs/BENCHMARKS.md``).
"""

from __future__ import annotations

import numpy as np
import trio

from pplex_trio.codec import OpusWriter, make_writer


class ThreadEncoders:
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
