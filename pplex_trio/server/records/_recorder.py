"""One call's record: what the model heard and what it said, written off the tick path.

The lease's observer (:meth:`Recorder.on_frame`, on the engine actor's task)
only appends a frame's two sides to a queue.  A task in the session's nursery
(:meth:`Recorder.run`) moves the queue to disk about once a second, on a
worker thread of the store's own limiter, so a slow disk never holds an
engine thread nor the event loop.  A disk that falls more than
:data:`MAX_QUEUED_FRAMES` behind loses the oldest queued frames (counted,
``frames_lost``): silence stands in for them, so the audio stays aligned.

The timeline is the model's: frame *k* of the record is the one the lease got
``k`` ticks after its first, at sample ``k × 1920``; a tick the conversation
was not stepped in (its prompt running again) is silence on both channels.
An outage (the call paused for a resume, its connection dropped) keeps the
call's real timeline: :meth:`Recorder.gap` puts its length, to the frame, as
silence on both channels where it was, and lists it in the JSON's ``gaps``
(``start`` and ``end`` in seconds on that timeline, ``reason``) and the text as
a cue of its own; the frames after it go on from its end.
When the session ends, whatever its ending, :meth:`Recorder.finish` writes the
last frames, closes the WAV and writes the text and the JSON (the files and
their blocking writes: ``_files.py``), shielded from cancellation but never
longer than :data:`FINISH_SECONDS`.

Error handling: a write that fails (a full disk, an I/O error, a folder
taken away) ends the recording of that call, never the call: one warning line
(no traceback), ``pplex_records_failed_total``, and the JSON says
``"complete": false`` with the error if it can still be written (else the
record's files are removed).  A call that never went live leaves no record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import trio

from ..._conversation import FRAME_MS, FRAME_SIZE, SAMPLE_RATE, Conversation, Outcome
from ..._metrics import Metrics
from ...engine import OutputFrame
from ._files import Closed, RecordFiles

logger = logging.getLogger(__name__)

WRITE_EVERY = 1.0  # s between the writer's moves to disk
MAX_QUEUED_FRAMES = 30 * 1000 // FRAME_MS  # 30 s not yet written; beyond, the oldest are lost
FINISH_SECONDS = 5.0  # the most a session's end waits for its record to be written
BUSY_POLL = 0.05  # s: how often the end looks whether a write left behind is done
_SILENCE = np.zeros(FRAME_SIZE, np.float32)
_SILENCE.flags.writeable = False


@dataclasses.dataclass(frozen=True)
class CallEnding:
    """What the session tells its recorder at the end."""

    outcome: Outcome  # how the session ended (its label is the record's ``ending``)
    close_code: int | None  # None: the client left without a close from us
    conversation: Conversation  # the settings it ended with (a persona change may have replaced the first)
    details: dict[str, Any]  # the protocol's (a carrier's call ids); the conversation's ``quality`` figures; the
    # lease's and the sender's counters: frames sent, dropped, skipped, input underruns …


def utc_stamp(moment: datetime.datetime) -> str:
    """``moment`` in UTC to the second, ISO 8601 with a ``Z`` (a record's ``started``)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Recorder:
    """One call's record, on the Trio side: the observer, the writer task and the end."""

    def __init__(
        self,
        record_id: str,
        folder: Path,
        *,
        protocol: str,
        conversation: Conversation,
        limiter: trio.CapacityLimiter,
        metrics: Metrics,
        on_done: Callable[[Recorder], None],
    ):
        self.id = record_id
        self.protocol = protocol
        self.conversation = conversation
        self.started = datetime.datetime.now(datetime.UTC)
        self.files = RecordFiles(folder, record_id)
        self.frames_lost = 0
        self._limiter = limiter
        self._metrics = metrics
        self._on_done = on_done
        self._first_tick: int | None = None  # the first tick observed since the start, or since the last gap
        self._origin = 0  # the position of that tick
        self._frames = 0  # positions on the timeline so far
        self._gaps: list[dict[str, Any]] = []  # the outages: start and end (s), reason
        self._text: list[tuple[int, str]] = []  # (position, piece): never dropped
        self._finished = False
        self._failure_told = False

    # -- the lease's observer (the actor's task: O(1), never raises) ---------

    def on_frame(self, frame: OutputFrame) -> None:
        """Queue one frame of the timeline (what was heard, what was said) and keep its text; 30 s behind, the
        oldest queued frame goes (``frames_lost``).  The lease's observer: on the actor's task, O(1), never raises."""
        if self._finished:
            return
        if self._first_tick is None:
            self._first_tick = frame.tick
        position = self._origin + frame.tick - self._first_tick
        self._frames = position + 1  # (the call's length, and its text, even once its audio cannot be written)
        if frame.text:
            self._text.append((position, frame.text))
        if self.files.error is not None:
            return
        queue = self.files.queue
        if len(queue) >= MAX_QUEUED_FRAMES:  # the disk is 30 s behind: the oldest frame goes
            with contextlib.suppress(IndexError):  # (the writer may have just taken it)
                queue.popleft()
                self.frames_lost += 1
        queue.append((position, _SILENCE if frame.heard is None else frame.heard, frame.pcm))

    def gap(self, seconds: float, reason: str) -> float:
        """The call was paused for ``seconds`` (an outage, ``reason``) after the frames observed so far: that
        much silence on the timeline, marked (none under half a frame); the seconds it takes there (whole
        frames)."""
        frames = max(0, round(seconds * 1000 / FRAME_MS))
        start = self._frames
        end = start + frames
        if frames:  # (a take-over by a live connection loses no time: nothing to mark)
            self._gaps.append({"start": start * FRAME_MS / 1000, "end": end * FRAME_MS / 1000, "reason": reason})
        self._origin, self._first_tick = end, None
        return frames * FRAME_MS / 1000

    # -- the writer task and the end -----------------------------------------

    async def run(self) -> None:
        """Move what was recorded to disk about once a second, until the session ends or a write fails."""
        while self.files.error is None:
            await trio.sleep(WRITE_EVERY)
            if self.files.queue:
                await self._in_thread(self.files.write_queued)
                self._tell_failure()

    async def finish(self, ending: CallEnding) -> None:
        """The call is over: write the rest, close the files (shielded; at most :data:`FINISH_SECONDS`).

        A write of this record that is still stuck on the disk is waited for
        without a thread of the limiter; if it is still stuck at the deadline,
        the record is closed by a thread of its own once the disk answers (its
        JSON then says it is incomplete), and the session goes.
        """
        self._finished = True
        description = self._description(ending)
        closed: Closed | None = None
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(FINISH_SECONDS):
                while self.files.busy:  # (a write the session's end left behind: a slow or hung disk)
                    await trio.sleep(BUSY_POLL)
                closed = await self._in_thread(self.files.close, description, self._text)
            if closed is None:
                stuck = self.files.busy
                self.files.error = self.files.error or f"the disk did not answer within {FINISH_SECONDS:g} s"
                if stuck:  # (else the close itself is stuck, on its abandoned thread)
                    threading.Thread(
                        target=self.files.close,
                        args=(description, self._text),
                        daemon=True,
                        name=f"call record {self.id}",
                    ).start()
            self._tell_failure()
            if self.frames_lost:
                self._metrics.record_frames_lost.inc(self.frames_lost)
                logger.warning(
                    "call record %s: %d frame(s) lost while the disk was more than %d s behind (silence "
                    "stands in for them)",
                    self.id,
                    self.frames_lost,
                    MAX_QUEUED_FRAMES * FRAME_MS // 1000,
                )
            if closed is Closed.WRITTEN:
                self._metrics.records_written.inc()
        finally:
            self._on_done(self)

    def describe(self) -> dict[str, Any]:
        """A record in progress, as ``GET /api/recordings`` lists it."""
        return {
            "id": self.id,
            "protocol": self.protocol,
            "persona": self.conversation.persona,
            "voice": self.conversation.voice,
            "started": utc_stamp(self.started),
            "seconds": self._frames * FRAME_MS / 1000,
            "frames": self._frames,
            "in_progress": True,
        }

    def _description(self, ending: CallEnding) -> dict[str, Any]:
        conversation = ending.conversation
        return {
            "id": self.id,
            "protocol": self.protocol,
            "persona": conversation.persona,
            "voice": conversation.voice,
            "started": utc_stamp(self.started),
            "seconds": self._frames * FRAME_MS / 1000,
            "frames": self._frames,
            "sample_rate": SAMPLE_RATE,
            "channels": ["caller", "agent"],
            "ending": ending.outcome.value,
            "close_code": ending.close_code,
            "gaps": self._gaps,
            **ending.details,
            "frames_lost": self.frames_lost,
        }

    def _tell_failure(self) -> None:
        """Say once that this record failed (the call goes on)."""
        if self.files.error is None or self._failure_told:
            return
        self._failure_told = True
        self._metrics.records_failed.inc()
        logger.warning("call record %s: cannot write (%s); the call goes on unrecorded", self.id, self.files.error)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        # abandon_on_cancel: a thread stuck on a hung disk holds neither the session nor its end.
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter, abandon_on_cancel=True)
