"""A call record's files, and the blocking writes that make them: the WAV, the WebVTT text and the JSON.

``RecordFiles`` is plain blocking I/O with no Trio in it: the :class:`~._recorder.Recorder` (the Trio side of a
record: the lease's observer, the writer task, the end) queues frames on it and calls :meth:`RecordFiles.write_queued`
and :meth:`RecordFiles.close` on worker threads; here they run one at a time under the record's lock.  It stands
apart so that what reaches the disk, and how a failed write stops it (``error``; never half a file under its
name), can be read and tested without the call around it.
"""

from __future__ import annotations

import collections
import contextlib
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

from ..._conversation import FRAME_MS, FRAME_SIZE, SAMPLE_RATE
from ...codec import pcm16_encode

logger = logging.getLogger(__name__)

FRAME_BYTES = FRAME_SIZE * 2 * 2  # one frame of the WAV: two channels of 16-bit samples
SILENCE_PIECE = 1000 // FRAME_MS  # frames of silence per write when a gap is filled
MAX_CUE_MS = 5000  # a text cue shows at most this long


class Closed(enum.Enum):
    """What became of a record at the end of its call."""

    WRITTEN = "written"  # whole
    INCOMPLETE = "incomplete"  # a write failed: its JSON says so
    LOST = "lost"  # not even its JSON could be written: its files are removed
    EMPTY = "empty"  # the call never went live: nothing written


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
                turns = (description.get("caller") or {}).get("turns")
                cues = webvtt(text, caller_turns=turns, gaps=description.get("gaps"))
                self._guarded(self._write_whole, self.vtt_path, cues.encode())
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


def _escaped(text: str) -> str:
    return " ".join(text.split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def webvtt(
    text: list[tuple[int, str]],
    caller_turns: list[dict[str, Any]] | None = None,
    gaps: list[dict[str, Any]] | None = None,
) -> str:
    """The agent's text pieces as WebVTT cues, each from its frame's time to the next piece's (at most
    :data:`MAX_CUE_MS`, never into an outage); with ``caller_turns`` (the caller's words, a transcriber's:
    ``start`` and ``end`` in seconds, ``text``), a cue per turn beside them, every cue voice-tagged ``<v agent>``
    or ``<v caller>``; each of ``gaps`` (an outage: ``start``, ``end`` in seconds, ``reason``) a cue
    ``[reason]`` over it; in order of their start."""
    cues: list[tuple[int, int, str]] = []
    outages = [(round(gap["start"] * 1000), round(gap["end"] * 1000), gap["reason"]) for gap in gaps or ()]
    for k, (position, piece) in enumerate(text):
        cue = _escaped(piece)
        if not cue:
            continue
        start = position * FRAME_MS
        end = text[k + 1][0] * FRAME_MS if k + 1 < len(text) else start + FRAME_MS
        end = min(max(end, start + FRAME_MS), start + MAX_CUE_MS)
        end = min([end, *(gap_start for gap_start, _, _ in outages if gap_start > start)])
        cues.append((start, end, f"<v agent>{cue}" if caller_turns is not None else cue))
    for turn in caller_turns or ():
        start = round(turn["start"] * 1000)
        cues.append((start, max(round(turn["end"] * 1000), start + FRAME_MS), f"<v caller>{_escaped(turn['text'])}"))
    cues += [(start, max(end, start + FRAME_MS), f"[{_escaped(reason)}]") for start, end, reason in outages]
    cues.sort(key=lambda cue: cue[0])
    lines = ["WEBVTT", ""]
    for start, end, cue in cues:
        lines += [f"{_cue_time(start)} --> {_cue_time(end)}", cue, ""]
    return "\n".join(lines)


def _cue_time(ms: int) -> str:
    seconds, ms = divmod(ms, 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{ms:03d}"
