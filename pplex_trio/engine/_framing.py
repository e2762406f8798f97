"""Cutting one conversation's input stream into engine frames.

This is the one place where incoming PCM (Opus pages of 40 ms, raw messages
of any length) becomes the fixed 1920-sample frames the engine consumes, one
per tick.  It also remembers when each sample arrived, so the server can
measure the latency it adds to every frame.

**Phase alignment.**  With frame boundaries at fixed multiples of 1920
samples, a frame completed just after a tick waits almost a whole tick (80 ms;
40 ms on average) before it is consumed.  With ``align=True`` the framer
watches how much audio is waiting at each tick beyond the frame it hands
over (the *surplus*).  Surplus that every tick of a recent window had is
never needed to ride out jitter, so the framer skips it once: from then on
the frame ends at the newest sample that arrived before the tick.  An
underrun (no whole frame at a tick) means some margin was needed: skipping is
held off for a while and the framer keeps a *margin* of audio from then on,
which grows with each underrun and shrinks slowly while all is calm.  So a
jittery client settles at the latency its jitter needs instead of paying a
late frame and a skip every few seconds.

**Catching up.**  Audio a client sent before its conversation was live (the
Realtime and raw protocols let it talk at once) is not thrown away: the
framer keeps the last :data:`EARLY_AUDIO_SECONDS` of it
(:meth:`InputFramer.keep_early`) and queues it ahead of the live audio when
the conversation goes live (:meth:`InputFramer.catch_up`), so the model
hears it, a little late.  While more than the usual backlog waits, frames
of silence at the head are skipped, so the conversation gets back to real
time over the caller's next pauses instead of staying behind for good;
phase alignment waits until it has.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from .._conversation import SAMPLE_RATE
from ..codec import is_silent

EARLY_AUDIO_SECONDS = 4.0
"""Audio a client may send before its conversation is live and still be heard."""


@dataclasses.dataclass(frozen=True)
class InputStats:
    """The input framer's view of one conversation, in samples (for ``/api/sessions``)."""

    pending: int
    margin: int
    underruns: int
    skipped: int


class InputFramer:
    """A FIFO of samples, read one whole frame per tick.

    At most ``max_frames`` whole frames wait; beyond that the *oldest* whole
    frames are dropped (real time beats completeness), so frame boundaries
    never shift because of a drop.  ``push`` returns how many frames it
    dropped so the caller can count them.
    """

    def __init__(
        self,
        frame_size: int,
        max_frames: int,
        *,
        align: bool = False,
        window: int = 25,
        min_skip: int | None = None,
        hold_after_underrun: int = 50,
    ):
        if max_frames < 1:
            raise ValueError("max_frames must be at least 1")
        self.frame_size = frame_size
        self.max_frames = max_frames
        self.align = align
        self.window = window
        self.min_skip = frame_size // 8 if min_skip is None else min_skip  # 10 ms at 24 kHz
        self.hold_after_underrun = hold_after_underrun
        # One extra frame of room holds a partial frame beside max_frames whole ones.
        self._capacity = (max_frames + 1) * frame_size
        self._buf = np.zeros(self._capacity, dtype=np.float32)
        self._catching_up = False
        self._early: collections.deque[tuple[np.ndarray, float]] = collections.deque()  # (pcm, arrival)
        self.early_samples = 0
        self.caught_up_samples = 0  # silence skipped to get back to real time
        self._len = 0
        self._start = 0  # stream position of _buf[0]
        self._arrivals: collections.deque[tuple[int, float]] = collections.deque()  # (end position, time)
        self._surplus: collections.deque[int] = collections.deque(maxlen=window)
        self._hold = 0
        self._popped = False
        self.margin = 0  # samples kept back against jitter (see the module docstring)
        self._last_arrival = float("-inf")
        self._last_push = 0  # samples in the newest push (a client's page size)
        self.skipped_samples = 0  # skipped by phase alignment
        self.underruns = 0
        self.input_ended = False  # the client sent its last audio (a flush): nothing more is taken

    @property
    def pending_samples(self) -> int:
        return self._len

    @property
    def pending_frames(self) -> int:
        return self._len // self.frame_size

    def stats(self) -> InputStats:
        return InputStats(self.pending_samples, self.margin, self.underruns, self.skipped_samples)

    @property
    def last_arrival(self) -> float:
        """When the newest samples arrived (-inf before any)."""
        return self._last_arrival

    @property
    def awaits_page(self) -> bool:
        """Aligned, streaming, and short of a whole frame by no more than one more page like the last.

        Its frame ends at a page that is due about now: the engine actor may
        hold a tick a few milliseconds for it (see ``EngineActor``).
        """
        return self.align and self._popped and self._len < self.frame_size <= self._len + self._last_push

    def push(self, pcm: np.ndarray, arrived_at: float = 0.0) -> int:
        """Append float32 mono samples that arrived at ``arrived_at``; return frames dropped."""
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if not pcm.size:
            return 0
        self._last_push = pcm.size
        overflow = self._len + pcm.size - self._capacity
        dropped = 0
        if overflow > 0:
            # Drop whole frames from the front of (buffer + pcm), so the
            # boundaries of the frames that survive do not move.
            dropped = -(-overflow // self.frame_size)
            cut = dropped * self.frame_size
            from_buffer = min(cut, self._len)
            self._discard(from_buffer)
            skip = cut - from_buffer
            self._start += skip
            pcm = pcm[skip:]
        self._buf[self._len : self._len + pcm.size] = pcm
        self._len += pcm.size
        self._arrivals.append((self._start + self._len, arrived_at))
        self._last_arrival = arrived_at
        return dropped

    def pop_frame_into(self, out: np.ndarray) -> float | None:
        """Move the next frame into ``out``; return when its last sample arrived.

        Returns ``None`` (and leaves ``out`` alone) when no whole frame is waiting.
        """
        if self._catching_up:
            self._skip_silence()
        surplus = self._len - self.frame_size
        if surplus < 0:
            if self.align and self._popped:  # before the first frame, nothing is late yet
                self.underruns += 1
                self._hold = self.hold_after_underrun
                self._surplus.clear()
                self.margin = min(self.margin + self.frame_size // 4, self.frame_size)
            return None
        if self.align and not self._catching_up:
            self._align(surplus)
        out[:] = self._buf[: self.frame_size]
        end = self._start + self.frame_size
        arrived = self._arrival_of(end)
        self._discard(self.frame_size)
        self._popped = True
        return arrived

    def pop_frame(self) -> np.ndarray | None:
        """The next whole frame as a new array, or ``None``."""
        frame = np.empty(self.frame_size, dtype=np.float32)
        return frame if self.pop_frame_into(frame) is not None else None

    def keep_early(self, pcm: np.ndarray, arrived_at: float) -> int:
        """Keep audio that came before the conversation is live (the last :data:`EARLY_AUDIO_SECONDS`);
        returns the frames that dropped out of that window."""
        pcm = np.array(pcm, dtype=np.float32).reshape(-1)
        self._early.append((pcm, arrived_at))
        self.early_samples += pcm.size
        dropped = 0
        while self.early_samples > EARLY_AUDIO_SECONDS * SAMPLE_RATE:
            old, _ = self._early.popleft()
            self.early_samples -= old.size
            dropped += old.size
        return -(-dropped // self.frame_size)

    def back_to_early(self) -> None:
        """The system prompt runs again (a persona change): what waits goes back ahead of the early audio."""
        if self._len:
            self.keep_early(self._buf[: self._len].copy(), self._last_arrival)
            self._discard(self._len)

    def catch_up(self) -> bool:
        """The conversation is live: queue what :meth:`keep_early` kept ahead of anything pushed since.

        Until at most the usual backlog waits again, silent frames at the
        head are skipped (see the module docstring).  False when nothing was kept.
        """
        early, self._early = list(self._early), collections.deque()
        total, self.early_samples = self.early_samples, 0
        if not total or self._len:
            return False
        self._capacity = (self.max_frames + 1) * self.frame_size + total
        if self._buf.size < self._capacity:
            self._buf = np.zeros(self._capacity, dtype=np.float32)
        self._catching_up = True
        for pcm, arrived in early:
            self.push(pcm, arrived)
        return True

    def _skip_silence(self) -> None:
        while self.pending_frames > self.max_frames and is_silent(self._buf[: self.frame_size]):
            self._discard(self.frame_size)
            self.caught_up_samples += self.frame_size
        if self.pending_frames <= self.max_frames:
            self._catching_up = False
            self._capacity = (self.max_frames + 1) * self.frame_size

    def pad_to_frame(self) -> None:
        """Complete a trailing partial frame with silence (used on flush)."""
        partial = self._len % self.frame_size
        if partial:
            fill = self.frame_size - partial
            if self._len + fill > self._capacity:
                self._discard(self.frame_size)
            last = self._arrivals[-1][1] if self._arrivals else 0.0
            self.push(np.zeros(fill, dtype=np.float32), last)

    def _align(self, surplus: int) -> None:
        if self._hold:
            self._hold -= 1
            return
        self._surplus.append(surplus)
        if len(self._surplus) == self.window:
            unneeded = min(self._surplus) - self.margin
            self._surplus.clear()
            if unneeded >= self.min_skip:
                self._discard(unneeded)
                self.skipped_samples += unneeded
            # A calm window lets the margin shrink again, 5 ms at a time.
            self.margin = max(0, self.margin - self.frame_size // 16)

    def _arrival_of(self, position: int) -> float:
        """When the sample just before stream ``position`` arrived."""
        for end, arrived in self._arrivals:
            if end >= position:
                return arrived
        return self._arrivals[-1][1]

    def _discard(self, count: int) -> None:
        count = min(count, self._len)
        remaining = self._len - count
        self._buf[:remaining] = self._buf[count : self._len]
        self._len = remaining
        self._start += count
        while self._arrivals and self._arrivals[0][0] <= self._start:
            self._arrivals.popleft()
