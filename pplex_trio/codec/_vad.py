"""A small voice-activity detector on the caller's audio, for the Realtime protocol's speech events.

PersonaPlex needs none (it hears everything); clients that drive their UI or
barge-in from ``speech_started`` / ``speech_stopped`` do.  An energy detector
with hysteresis is enough for that: speech starts once the level has stayed
above ``threshold_db`` (RMS over 20 ms windows, dB full scale) for
``start_ms``, and stops once it has stayed below for ``stop_ms`` (the
protocol's ``silence_duration_ms``).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SpeechEvent:
    """Speech started or stopped, at a position in the caller's audio (ms from its first sample)."""

    started: bool  # True: speech started, False: stopped
    at_ms: int  # where in the caller's audio, from its first sample


SPEECH_THRESHOLD_DB = -42.0
"""RMS (dB full scale) above which audio counts as speech."""


def is_silent(pcm: np.ndarray, threshold_db: float = SPEECH_THRESHOLD_DB) -> bool:
    """Whether ``pcm`` stays below the speech threshold (RMS over all of it)."""
    return float(np.sqrt(np.mean(np.asarray(pcm, dtype=np.float64) ** 2))) < 10 ** (threshold_db / 20)


class EnergyVAD:
    """Energy voice activity detection: RMS of ``window_ms`` windows against a threshold, with ``start_ms`` of loud
    audio to start speech and ``stop_ms`` of quiet to stop it.
    """

    def __init__(
        self,
        sample_rate: int,
        *,
        threshold_db: float = SPEECH_THRESHOLD_DB,
        start_ms: int = 100,
        stop_ms: int = 480,
        window_ms: int = 20,
    ):
        self.sample_rate = sample_rate
        self.threshold = 10 ** (threshold_db / 20)
        self.window = sample_rate * window_ms // 1000
        self.start_windows = max(1, start_ms // window_ms)
        self.stop_windows = max(1, stop_ms // window_ms)
        self.speaking = False
        self._pending = np.zeros(0, dtype=np.float32)
        self._samples = 0  # samples consumed into whole windows
        self._run = 0  # windows in a row on the other side of the threshold
        self._run_start = 0  # where that run began, in samples

    def feed(self, pcm: np.ndarray) -> list[SpeechEvent]:
        """Audio in (any chunk size); the speech starts and stops it completes."""
        audio = np.concatenate([self._pending, np.asarray(pcm, dtype=np.float32)])
        whole = audio.size // self.window * self.window
        self._pending = audio[whole:]
        events = []
        for window in audio[:whole].reshape(-1, self.window) if whole else ():
            loud = float(np.sqrt(np.mean(window.astype(np.float64) ** 2))) >= self.threshold
            if loud != self.speaking:
                if self._run == 0:
                    self._run_start = self._samples
                self._run += 1
                if self._run >= (self.start_windows if loud else self.stop_windows):
                    self.speaking = loud
                    self._run = 0
                    events.append(SpeechEvent(loud, self._run_start * 1000 // self.sample_rate))
            else:
                self._run = 0
            self._samples += self.window
        return events
