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


def best_window(frame: np.ndarray, signal: np.ndarray) -> tuple[int, float]:
    """Where in `signal` a window as long as `frame` is most like it: its offset, and their cosine similarity
    (1.0 for a copy).  Windows that are (near) silence never match."""
    n = frame.size
    size = 1 << int(np.ceil(np.log2(signal.size + n)))
    dots = np.fft.irfft(np.fft.rfft(signal, size) * np.conj(np.fft.rfft(frame, size)), size)[: signal.size - n + 1]
    energy = np.concatenate([[0.0], np.cumsum(signal.astype(np.float64) ** 2)])
    window_energy = energy[n:] - energy[:-n]
    audible = window_energy > 1e-6 * n  # an RMS above 1e-3
    similarity = np.where(audible, dots / np.sqrt(np.where(audible, window_energy, 1.0)), 0.0)
    similarity /= max(float(np.linalg.norm(frame)), 1e-12)
    offset = int(np.argmax(similarity))
    return offset, float(similarity[offset])
