"""16-bit little-endian PCM, the Realtime protocol's ``audio/pcm``: float32 in [-1, 1) to bytes and back."""

from __future__ import annotations

import numpy as np


def pcm16_encode(pcm: np.ndarray) -> bytes:
    """float PCM → int16 bytes (clipped to the 16-bit range, truncated toward zero)."""
    samples: np.ndarray = (np.clip(pcm, -1.0, 32767 / 32768) * 32768.0).astype("<i2")
    return samples.tobytes()


def pcm16_decode(data: bytes) -> np.ndarray:
    """int16 bytes (an even number) → float32 PCM."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
