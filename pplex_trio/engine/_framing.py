"""Cutting one conversation's input stream into engine frames.

This is the one place where incoming PCM (any chunk size: Opus pages of
40 ms, raw messages of odd lengths) becomes the fixed 1920-sample frames the
engine consumes, one per tick.  Keeping it in one place lets the latency
work align frame boundaries to the tick phase here and nowhere else.
"""

from __future__ import annotations

import numpy as np


class InputFramer:
    """A FIFO of samples, read one whole frame at a time.

    At most ``max_frames`` whole frames wait; beyond that the *oldest* whole
    frames are dropped (real time beats completeness), so frame boundaries
    never shift because of a drop.  ``push`` returns how many frames it
    dropped so the caller can count them.
    """

    def __init__(self, frame_size: int, max_frames: int):
        if max_frames < 1:
            raise ValueError("max_frames must be at least 1")
        self.frame_size = frame_size
        self.max_frames = max_frames
        # One extra frame of room holds a partial frame beside max_frames whole ones.
        self._buf = np.zeros((max_frames + 1) * frame_size, dtype=np.float32)
        self._len = 0

    @property
    def pending_samples(self) -> int:
        return self._len

    @property
    def pending_frames(self) -> int:
        return self._len // self.frame_size

    def push(self, pcm: np.ndarray) -> int:
        """Append float32 mono samples; return the number of frames dropped."""
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        overflow = self._len + pcm.size - self._buf.size
        dropped = 0
        if overflow > 0:
            # Drop whole frames from the front of (buffer + pcm), so the
            # boundaries of the frames that survive do not move.
            dropped = -(-overflow // self.frame_size)
            cut = dropped * self.frame_size
            from_buffer = min(cut, self._len)
            self._discard(from_buffer)
            pcm = pcm[cut - from_buffer :]
        self._buf[self._len : self._len + pcm.size] = pcm
        self._len += pcm.size
        return dropped

    def pop_frame(self) -> np.ndarray | None:
        """The oldest whole frame (a new array), or ``None`` if none is complete."""
        if self._len < self.frame_size:
            return None
        frame = self._buf[: self.frame_size].copy()
        self._discard(self.frame_size)
        return frame

    def pop_frame_into(self, out: np.ndarray) -> bool:
        """Move the oldest whole frame into ``out``; ``False`` if none is complete."""
        if self._len < self.frame_size:
            return False
        out[:] = self._buf[: self.frame_size]
        self._discard(self.frame_size)
        return True

    def pad_to_frame(self) -> None:
        """Complete a trailing partial frame with silence (used on flush)."""
        partial = self._len % self.frame_size
        if partial:
            fill = self.frame_size - partial
            if self._len + fill > self._buf.size:
                self._discard(self.frame_size)
            self._buf[self._len : self._len + fill] = 0.0
            self._len += fill

    def _discard(self, count: int) -> None:
        count = min(count, self._len)
        remaining = self._len - count
        self._buf[:remaining] = self._buf[count : self._len]
        self._len = remaining
