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
When the session ends, whatever its ending, :meth:`Recorder.finish` writes the
last frames, closes the WAV and writes the text and the JSON, shielded from
cancellation but never longer than :data:`FINISH_SECONDS`.

Error handling: a write that fails (a full disk, an I/O error, a folder
taken away) ends the recording of that call, never the call: one warning line
(no traceback), ``pplex_records_failed_total``, and the JSON says
``"complete": false`` with the error if it can still be written (else the
record's files are removed).  A call that never went live leaves no record.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import enum
import json
import logging
import os
import threading
import wave
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
import trio

from ..._conversation import FRAME_MS, FRAME_SIZE, SAMPLE_RATE, Conversation, Outcome
from ..._metrics import Metrics
from ...codec import pcm16_encode
from ...engine import OutputFrame

logger = logging.getLogger(__name__)

FRAME_BYTES = FRAME_SIZE * 2 * 2  # one frame of the WAV: two channels of 16-bit samples
WRITE_EVERY = 1.0  # s between the writer's moves to disk
MAX_QUEUED_FRAMES = 30 * 1000 // FRAME_MS  # 30 s not yet written; beyond, the oldest are lost
FINISH_SECONDS = 5.0  # the most a session's end waits for its record to be written
BUSY_POLL = 0.05  # s: how often the end looks whether a write left behind is done
SILENCE_PIECE = 1000 // FRAME_MS  # frames of silence per write when a gap is filled
MAX_CUE_MS = 5000  # a text cue shows at most this long
_SILENCE = np.zeros(FRAME_SIZE, np.float32)
_SILENCE.flags.writeable = False


class Closed(enum.Enum):
    """What became of a record at the end of its call."""

    WRITTEN = "written"  # whole
    INCOMPLETE = "incomplete"  # a write failed: its JSON says so
    LOST = "lost"  # not even its JSON could be written: its files are removed
    EMPTY = "empty"  # the call never went live: nothing written


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
        self._first_tick: int | None = None
        self._frames = 0  # positions on the timeline so far
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
        position = frame.tick - self._first_tick
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


QueuedFrame = tuple[int, np.ndarray, np.ndarray]  # (position, heard, said)


class RecordFiles:
    """A record's files, written on worker threads, one at a time (``_lock``): ``<id>.wav`` (stereo 16-bit at
    24 kHz, the caller left, the agent right), then at the end ``<id>.vtt`` and ``<id>.json``."""

    def __init__(self, folder: Path, record_id: str):
        self.wav_path = folder / f"{record_id}.wav"
        self.vtt_path = folder / f"{record_id}.vtt"
        self.json_path = folder / f"{record_id}.json"
        self.queue: collections.deque[QueuedFrame] = collections.deque()  # (appended on the Trio thread)
        self.error: str | None = None  # why writing stopped
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._wav: wave.Wave_write | None = None
        self._written = 0  # timeline positions in the WAV, silence included

    @property
    def busy(self) -> bool:
        """A thread is writing (or stuck writing) this record."""
        return self._lock.locked()

    @staticmethod
    def _open(path: Path) -> IO[bytes]:
        """The one place a record's file is opened for writing."""
        return open(path, "wb")

    def write_queued(self) -> None:
        """(On a thread.) Append the queued frames to the WAV; a failure stops the audio for good (``error``)."""
        with self._lock:
            self._guarded(self._write_queued)

    def close(self, description: dict[str, Any], text: list[tuple[int, str]]) -> Closed:
        """The end of the call: the rest of the audio, then the text, then the JSON (last: a record with a JSON is
        finished)."""
        with self._lock:
            self._guarded(self._write_queued)
            if self._wav is None and self.error is None:
                return Closed.EMPTY
            self._guarded(self._close_wav)
            self._drop_files()  # (what a failure, or a finish that gave up on this thread, left open)
            if self.error is None:
                self._guarded(self._write_whole, self.vtt_path, webvtt(text).encode())
            description.update(
                complete=self.error is None,
                error=self.error,
                text=[{"t": position * FRAME_MS / 1000, "text": piece} for position, piece in text],
            )
            try:
                self._write_whole(self.json_path, json.dumps(description, ensure_ascii=False, indent=1).encode())
            except Exception as exc:
                self.error = self.error or _reason(exc)
                for path in (self.wav_path, self.vtt_path):
                    with contextlib.suppress(OSError):
                        path.unlink(missing_ok=True)
                return Closed.LOST
            return Closed.WRITTEN if self.error is None else Closed.INCOMPLETE

    # -- inside (the lock held) -----------------------------------------------

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        """Run one step of writing; a failure stops the audio for good (the caller writes what it still can)."""
        if self.error is not None:
            return
        try:
            fn(*args)
        except OSError as exc:
            self._stop(_reason(exc))
        except Exception as exc:  # a bug of ours: said with its traceback, and the call still goes on
            logger.exception("call record %s: internal error while writing", self.wav_path.stem)
            self._stop(_reason(exc))

    def _stop(self, error: str) -> None:
        self.error = error
        self.queue.clear()
        self._drop_files()

    def _drop_files(self) -> None:
        """Close what is open, quietly (after a failure: the error is known already)."""
        wav, file, self._wav, self._file = self._wav, self._file, None, None
        for closing in (wav, file):
            if closing is not None:
                with contextlib.suppress(Exception):
                    closing.close()

    def _write_queued(self) -> None:
        items: list[QueuedFrame] = []
        with contextlib.suppress(IndexError):
            while True:
                items.append(self.queue.popleft())
        if not items:
            return
        wav = self._wav or self._open_wav()
        stereo = np.empty((FRAME_SIZE, 2), np.float32)
        pieces: list[bytes] = []
        for position, heard, said in items:
            if position < self._written:
                continue  # (never: ticks only grow)
            if position > self._written:  # ticks it was not stepped in: silence on both sides
                wav.writeframes(b"".join(pieces))
                pieces = []
                self._silence(position - self._written)
            stereo[:, 0] = heard
            stereo[:, 1] = said
            pieces.append(pcm16_encode(stereo))
            self._written += 1
        wav.writeframes(b"".join(pieces))

    def _silence(self, frames: int) -> None:
        assert self._wav is not None
        while frames:
            n = min(frames, SILENCE_PIECE)
            self._wav.writeframes(bytes(n * FRAME_BYTES))
            frames -= n
            self._written += n

    def _open_wav(self) -> wave.Wave_write:
        self._file = self._open(self.wav_path)
        wav = wave.open(self._file, "wb")
        wav.setnchannels(2)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        self._wav = wav
        return wav

    def _close_wav(self) -> None:
        if self._wav is not None:
            self._wav.close()  # (the header's sizes; the file is ours to close)
        if self._file is not None:
            self._file.close()
        self._wav = self._file = None

    def _write_whole(self, path: Path, data: bytes) -> None:
        """Write ``data`` beside ``path``, then rename it into place: never half a file under its name."""
        partial = path.with_name(path.name + ".partial")
        try:
            with self._open(partial) as file:
                file.write(data)
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            raise


def _reason(exc: Exception) -> str:
    """Why a write failed, in words ("No space left on device")."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return f"internal error: {type(exc).__name__}"


def webvtt(text: list[tuple[int, str]]) -> str:
    """The agent's text pieces as WebVTT cues, each from its frame's time to the next piece's (at most
    :data:`MAX_CUE_MS`)."""
    lines = ["WEBVTT", ""]
    for k, (position, piece) in enumerate(text):
        cue = " ".join(piece.split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        if not cue:
            continue
        start = position * FRAME_MS
        end = text[k + 1][0] * FRAME_MS if k + 1 < len(text) else start + FRAME_MS
        end = min(max(end, start + FRAME_MS), start + MAX_CUE_MS)
        lines += [f"{_cue_time(start)} --> {_cue_time(end)}", cue, ""]
    return "\n".join(lines)


def _cue_time(ms: int) -> str:
    seconds, ms = divmod(ms, 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{ms:03d}"
