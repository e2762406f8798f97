"""Streaming sample-rate conversion between a client's rate and the model's 24 kHz.

libsoxr (the SoX resampler, through the python-soxr wheel) at its "MQ"
setting: band-limited, flat to 3.7 kHz and over 110 dB of rejection above the
8 kHz Nyquist limit (measured), 16-bit precision, which is more than G.711's
companded 8 bits carry, and about 14 ms of filter delay, where "HQ" costs
19 ms for precision telephony audio does not have.  A linear or cubic
interpolator would alias audibly ("QQ", soxr's cubic one, leaves images of a
3 kHz tone at -12 dB; "LQ" is 8 dB down at 3.4 kHz); numpy has no band-limited
resampler; sphn's works on whole signals, not on a stream cut into 80 ms
pieces.  soxr keeps the filter state between chunks, so the stream is
resampled as one signal.

soxr hands its output on in blocks (1576 samples at 24 kHz from 8 kHz, 788
from 16 kHz), so what a chunk gives back varies from chunk to chunk.  The
caller's audio goes to the input framer, which learns a client's rhythm from
what it is given: ``steady=True`` evens it out (see :class:`StreamResampler`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import soxr

QUALITY = "MQ"


class StreamResampler:
    """One direction of one stream: float32 chunks at ``from_rate`` in, float32 at ``to_rate`` out.

    ``steady=True``: each chunk gives back its own duration, a constant delay
    behind (the most soxr ever holds: 75 ms from 8 kHz, 38 ms from 16 kHz),
    instead of one block or two.  A tick has to wait for that much anyway to
    find every frame complete.  Unsteady, Exotel's 100 ms chunks gave 1576 or
    3152 samples in a pattern that comes round only every 4.4 s, which the
    tick grid took for a rhythm it had learnt and missed (measured: 11 silent
    frames a minute, the caller 880 ms late at the end).
    """

    def __init__(self, from_rate: int, to_rate: int, *, steady: bool = False):
        self.from_rate = from_rate
        self.to_rate = to_rate
        self._stream = (
            soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality=QUALITY)
            if from_rate != to_rate
            else None
        )
        self.delay = _largest_hold(from_rate, to_rate) if steady and self._stream is not None else 0
        self._ready = np.zeros(0, np.float32)  # resampled, not yet given back (steady)
        self._taken = self._given = 0  # samples in, samples out (steady)

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        pcm = np.ascontiguousarray(pcm, dtype=np.float32)
        if self._stream is None:
            return pcm
        out: np.ndarray = self._stream.resample_chunk(pcm)  # soxr is untyped
        if not self.delay:
            return out
        self._taken += pcm.size
        due = max(0, round(self._taken * self.to_rate / self.from_rate) - self.delay - self._given)
        ready = np.concatenate([self._ready, out])
        out, self._ready = ready[:due], ready[due:]
        self._given += out.size
        return out


@functools.cache
def _largest_hold(from_rate: int, to_rate: int) -> int:
    """The most output samples soxr holds back from ``from_rate`` to ``to_rate``: all it has been given when its
    first block comes out (measured so, it is the largest hold later too, to a sample at 8 and 16 kHz)."""
    probe = soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32", quality=QUALITY)
    sample = np.zeros(1, np.float32)
    taken = 1
    while not probe.resample_chunk(sample).size:
        taken += 1
    return math.ceil(taken * to_rate / from_rate)
