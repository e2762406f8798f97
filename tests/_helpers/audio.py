"""Audio comparisons for tests."""

from __future__ import annotations

import numpy as np


def correlation_at(sent: np.ndarray, got: np.ndarray, lag: int) -> float:
    """Pearson correlation of `sent` with `got` shifted back by `lag` samples."""
    n = min(sent.size, got.size - lag)
    return float(np.corrcoef(sent[:n], got[lag : lag + n])[0, 1])


def best_lag(sent: np.ndarray, got: np.ndarray, min_lag: int, max_lag: int) -> tuple[int, float]:
    """The lag in [min_lag, max_lag] where `got` best matches `sent` (FFT cross-correlation)."""
    size = 1 << int(np.ceil(np.log2(sent.size + got.size)))
    spectrum = np.fft.rfft(got, size) * np.conj(np.fft.rfft(sent, size))
    xcorr = np.fft.irfft(spectrum, size)[min_lag : max_lag + 1]
    lag = min_lag + int(np.argmax(xcorr))
    return lag, correlation_at(sent, got, lag)
