"""Cutting one conversation's input stream into engine frames, and getting back to real time after a burst.

This is the one place where incoming PCM (Opus pages of 40 ms, raw messages
of any length) becomes the fixed 1920-sample frames the engine consumes, one
per tick.  It also remembers when each sample arrived, so the server can
measure the latency it adds to every frame.

**Phase alignment.**  With frame boundaries at fixed multiples of 1920
samples, a frame completed just after a tick waits almost a whole tick (80 ms;
40 ms on average) before it is consumed.  With ``align=True`` the framer
watches how much audio is waiting at each tick beyond the frame it hands
over (the *surplus*).  Surplus (less than a frame) that every tick of a recent
window had is never needed to ride out jitter, so the framer skips it once:
from then on the frame ends at the newest sample that arrived before the
tick.  An underrun (no whole frame at a tick) means some margin was needed:
skipping is held off for a while and the framer keeps a *margin* of audio
from then on, which grows with each run of underruns (a stall is one run) and
shrinks slowly while all is calm.  So a jittery client settles at the latency
its jitter needs instead of paying a late frame and a skip every few seconds.

**Catching up.**  A caller's audio may come in a burst: what it said before
its conversation was live (kept by :meth:`InputFramer.keep_early`, queued by
:meth:`InputFramer.catch_up`), or what a network stall held back and then
delivered at once (Wi-Fi retries, a handover, a TCP retransmission).  All of
it is kept while it fits the backlog (``max_frames``, a few seconds; beyond
that the oldest whole frames go, counted).  Then, while more than the
conversation's *usual* surplus waits (the smallest of its recent calm ticks;
two frames more at once, or, with phase alignment, one frame more for a
whole window, so that a page's jitter is no lag), the caller's **silent**
frames at the head are not fed to the model: the lag is worked off over the
caller's next pauses, and no speech is ever skipped.
So a stall costs neither words nor lasting latency.  Phase alignment waits
until the conversation is back to real time.  A tick that will skip silence
(:attr:`InputFramer.skips_silence_next`) starts at its deadline, not early:
started early for the backlog's frames, the last tick of a catch-up left the
frame that landed between it and its deadline for the next tick, and so every
frame after it (a tick of latency for the rest of the call: 85 → 158 ms from
outside, ``tests/server/sessions/test_turnaround_after_a_stall.py``).

**One frame more is no lag without phase alignment.**  A caller at real time
whose frames land near the tick finds one more frame waiting whenever the
tick starts a little later against its arrivals (a tick starts up to
``early_start_ms`` early or on time, as the other conversations' frames
allow; under load, when the server reads a frame a moment late, a tick is
fed silence first).  Nothing came early: that frame is the caller's own
timing against the tick's.  Counted as lag, it was skipped as soon as it was
a silent one, and the next tick that started early found no frame and fed
the model silence: a quiet caller beside churning clients lost a frame every
few seconds.  So without phase alignment only two frames more start a catch
up; a caller's timing can cost it one frame of latency, never its audio.
(With phase alignment, the margin and the alignment own that frame.)
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from ..codec import is_silent


@dataclasses.dataclass(frozen=True)
class InputStats:
    """The input framer's view of one conversation, in samples (for ``/api/sessions``)."""

    pending: int
    margin: int
    underruns: int
    skipped: int  # by phase alignment
    caught_up: int  # silence not fed to the model, to get back to real time
    behind: int  # beyond the usual backlog, now


class InputFramer:
    """A FIFO of samples, read one whole frame per tick.

    At most ``max_frames`` whole frames wait; beyond that the *oldest* whole
    frames are dropped, so frame boundaries never shift because of a drop.
    ``push`` returns how many frames it dropped so the caller can count them.
    ``window`` and ``hold_after_underrun`` count ticks (one pop each): the
    schedule turns the settings' seconds (``framer_window``, ``framer_hold``)
    into them.
    """

    def __init__(
        self,
        frame_size: int,
        max_frames: int,
        *,
        align: bool = False,
        window: int,
        hold_after_underrun: int,
        min_skip: int | None = None,
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
        self._len = 0
        self._start = 0  # stream position of _buf[0]
        self._arrivals: collections.deque[tuple[int, float]] = collections.deque()  # (end position, time)
        self._early: collections.deque[tuple[np.ndarray, float]] = collections.deque()  # (pcm, arrival)
        self.early_samples = 0
        self._surplus: collections.deque[int] = collections.deque(maxlen=window)  # aligned: the recent surplus
        self._calm: collections.deque[int] = collections.deque(maxlen=window)  # what waited after calm pops
        self._catching_up = False
        self._lagging = 0  # aligned: ticks in a row a frame or more behind (a steady lag, not a page's jitter)
        self._hold = 0
        self._popped = False
        self._starved = False  # the last tick found no whole frame (an underrun run goes on)
        self.margin = 0  # samples kept back against jitter (see the module docstring)
        self._last_arrival = float("-inf")
        self._last_push = 0  # samples in the newest push (a client's page size)
        self.skipped_samples = 0  # skipped by phase alignment
        self.caught_up_samples = 0  # silence skipped to get back to real time
        self.underruns = 0

    @property
    def pending_samples(self) -> int:
        """Samples waiting for the next ticks."""
        return self._len

    @property
    def pending_frames(self) -> int:
        """Whole frames waiting for the next ticks."""
        return self._len // self.frame_size

    @property
    def usual(self) -> int:
        """What usually waits beyond the frame a tick takes: the least of the recent calm ticks (before there
        are any, what waits now, unless audio from before it was live is being caught up with: none)."""
        if self._calm:
            return min(self._calm)
        return 0 if self._catching_up else max(0, self._len - self.frame_size)

    @property
    def behind(self) -> int:
        """Samples waiting beyond the next frame and the usual surplus: how far behind real time it is."""
        return max(0, self._len - self.frame_size - self.usual)

    @property
    def last_arrival(self) -> float:
        """When the newest samples arrived (-inf before any)."""
        return self._last_arrival

    @property
    def awaits_page(self) -> bool:
        """Aligned, streaming, and short of a whole frame by no more than one more page like the last.

        Its frame ends at a page that is due about now: the tick schedule may
        hold a tick a few milliseconds for it.
        """
        return self.align and self._popped and self._len < self.frame_size <= self._len + self._last_push

    @property
    def skips_silence_next(self) -> bool:
        """Behind real time with silence at its head: the next pop skips that silence, up to the newest whole
        frame then waiting (so a tick that starts at its deadline, not early, also skips past a frame that
        arrives until then: see the module docstring)."""
        if self._len < self.frame_size or not is_silent(self._buf[: self.frame_size]):
            return False
        behind = self.behind
        lagging = self._lagging + 1 if behind >= self.frame_size and self.align else 0
        return behind >= self.min_skip and self._catches_up(behind, lagging)

    def stats(self) -> InputStats:
        """Its figures now, in samples: what waits, the margin, underruns, skipped, caught up, how far behind."""
        return InputStats(
            self._len, self.margin, self.underruns, self.skipped_samples, self.caught_up_samples, self.behind
        )

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
        if self._len < self.frame_size:
            self._underrun()
            return None
        self._starved = False
        behind = self.behind
        self._lagging = self._lagging + 1 if behind >= self.frame_size and self.align else 0
        if self._catches_up(behind, self._lagging):
            self._skip_silence()
        elif self.align:
            self._align(self._len - self.frame_size)
        if not self._catching_up:
            self._calm.append(self._len - self.frame_size)
        out[:] = self._buf[: self.frame_size]
        arrived = self._arrival_of(self._start + self.frame_size)
        self._discard(self.frame_size)
        self._popped = True
        return arrived

    def pop_frame(self) -> np.ndarray | None:
        """The next whole frame as a new array, or ``None``."""
        frame = np.empty(self.frame_size, dtype=np.float32)
        return frame if self.pop_frame_into(frame) is not None else None

    def renewed(self) -> InputFramer:
        """A new framer with the same settings and nothing in it: a resumed conversation's input starts afresh
        (what waited for the dropped connection is not replayed, and no catch-up or skip follows the outage)."""
        return InputFramer(
            self.frame_size,
            self.max_frames,
            align=self.align,
            window=self.window,
            hold_after_underrun=self.hold_after_underrun,
            min_skip=self.min_skip,
        )

    def keep_early(self, pcm: np.ndarray, arrived_at: float) -> int:
        """Keep audio that came before the conversation is live (the newest ``max_frames`` of it); returns
        the frames that dropped out of that window."""
        pcm = np.array(pcm, dtype=np.float32).reshape(-1)
        self._early.append((pcm, arrived_at))
        self.early_samples += pcm.size
        dropped = 0
        while self.early_samples > self.max_frames * self.frame_size:
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
        """The conversation is live: queue what :meth:`keep_early` kept ahead of anything pushed since (it is
        caught up with as a burst is; see the module docstring).  False when nothing was kept."""
        early, self._early = list(self._early), collections.deque()
        total, self.early_samples = self.early_samples, 0
        if not total or self._len:
            return False
        for pcm, arrived in early:
            self.push(pcm, arrived)
        self._catching_up = True
        return True

    def pad_to_frame(self) -> None:
        """Complete a trailing partial frame with silence (used on flush)."""
        partial = self._len % self.frame_size
        if partial:
            fill = self.frame_size - partial
            if self._len + fill > self._capacity:
                self._discard(self.frame_size)
            last = self._arrivals[-1][1] if self._arrivals else 0.0
            self.push(np.zeros(fill, dtype=np.float32), last)

    # -- inside --------------------------------------------------------------

    def _underrun(self) -> None:
        if not (self.align and self._popped):  # before the first frame, nothing is late yet
            return
        self.underruns += 1
        self._hold = self.hold_after_underrun
        self._surplus.clear()
        if not self._starved:  # a stall is one run of underruns: it widens the margin once
            self.margin = min(self.margin + self.frame_size // 4, self.frame_size)
        self._starved = True

    def _catches_up(self, behind: int, lagging: int) -> bool:
        """A pop with ``behind`` (and ``lagging`` ticks of a steady lag) skips silence to catch up."""
        return self._catching_up or behind >= 2 * self.frame_size or lagging >= self.window

    def _skip_silence(self) -> None:
        """Behind real time: drop the caller's silence at the head (whole frames, then what is left of the lag
        if that is silent too), never its speech."""
        frame = self.frame_size
        while self.behind >= frame and is_silent(self._buf[:frame]):
            self._discard(frame)
            self.caught_up_samples += frame
        behind = self.behind
        if self.min_skip <= behind < frame and is_silent(self._buf[:frame]):  # (within a silent frame only)
            self._discard(behind)
            self.caught_up_samples += behind
            behind = 0
        self._catching_up = behind >= self.min_skip

    def _align(self, surplus: int) -> None:
        if self._hold:
            self._hold -= 1
            return
        self._surplus.append(surplus)
        if len(self._surplus) == self.window:
            unneeded = min(min(self._surplus) - self.margin, self.frame_size - 1)  # (a backlog is caught up with)
            self._surplus.clear()
            if unneeded >= self.min_skip:
                self._discard(unneeded)
                self.skipped_samples += unneeded
                self._calm.clear()  # what usually waits is less from now on
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
