"""G.711 μ-law and A-law, the 8 kHz companded audio of telephone networks (ITU-T G.711).

The classic segment algorithms (as in Sun's public-domain ``g711.c``), run
over every 16-bit sample and byte to build lookup tables at import (numpy:
a few ms); encoding and decoding are then one numpy indexing each.  The
per-sample functions state the algorithm; the array ones build the tables,
and a test holds the two equal.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

_BIAS = 0x84  # μ-law: added to the magnitude before the segment search
_ULAW_SEGMENT_ENDS = (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF)


def _ulaw_byte(sample: int) -> int:
    value = sample >> 2  # μ-law codes 14-bit samples
    if value < 0:
        value, mask = -value, 0x7F
    else:
        mask = 0xFF
    value = min(value, 8159) + (_BIAS >> 2)
    segment = next((i for i, end in enumerate(_ULAW_SEGMENT_ENDS) if value <= end), 8)
    if segment >= 8:
        return 0x7F ^ mask
    return ((segment << 4) | ((value >> (segment + 1)) & 0x0F)) ^ mask


def _ulaw_sample(byte: int) -> int:
    byte = ~byte & 0xFF
    exponent, mantissa = (byte >> 4) & 0x07, byte & 0x0F
    magnitude = (((mantissa << 3) + _BIAS) << exponent) - _BIAS
    return -magnitude if byte & 0x80 else magnitude


_ALAW_SEGMENT_ENDS = (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF)


def _alaw_byte(sample: int) -> int:
    value = sample >> 3  # A-law codes 13-bit samples
    if value >= 0:
        mask = 0xD5
    else:
        mask = 0x55
        value = -value - 1
    segment = next((i for i, end in enumerate(_ALAW_SEGMENT_ENDS) if value <= end), 8)
    if segment >= 8:
        return 0x7F ^ mask
    code = segment << 4
    code |= (value >> 1) & 0x0F if segment < 2 else (value >> segment) & 0x0F
    return code ^ mask


def _alaw_sample(byte: int) -> int:
    byte ^= 0x55
    value = (byte & 0x0F) << 4
    segment = (byte & 0x70) >> 4
    if segment == 0:
        value += 8
    else:
        value = (value + 0x108) << (segment - 1)
    return value if byte & 0x80 else -value


def _encode_table(byte_of: Callable[[np.ndarray], np.ndarray]) -> npt.NDArray[np.uint8]:
    return byte_of(np.arange(-32768, 32768, dtype=np.int64)).astype(np.uint8)


def _ulaw_bytes(samples: np.ndarray) -> np.ndarray:
    """:func:`_ulaw_byte` over an array (the tables are built with this: a few ms at import)."""
    value = samples >> 2
    mask = np.where(value < 0, 0x7F, 0xFF)
    value = np.minimum(np.abs(value), 8159) + (_BIAS >> 2)
    segment = np.searchsorted(np.array(_ULAW_SEGMENT_ENDS), value)  # first end >= value
    code = (segment << 4) | ((value >> (segment + 1)) & 0x0F)
    return np.where(segment >= 8, 0x7F, code) ^ mask


def _alaw_bytes(samples: np.ndarray) -> np.ndarray:
    """:func:`_alaw_byte` over an array."""
    value = samples >> 3
    negative = value < 0
    mask = np.where(negative, 0x55, 0xD5)
    value = np.where(negative, -value - 1, value)
    segment = np.searchsorted(np.array(_ALAW_SEGMENT_ENDS), value)
    shift = np.where(segment < 2, 1, segment)
    code = (segment << 4) | ((value >> shift) & 0x0F)
    return np.where(segment >= 8, 0x7F, code) ^ mask


_ULAW_ENCODE = _encode_table(_ulaw_bytes)
_ALAW_ENCODE = _encode_table(_alaw_bytes)
_ULAW_DECODE = np.array([_ulaw_sample(b) for b in range(256)], dtype=np.int16)
_ALAW_DECODE = np.array([_alaw_sample(b) for b in range(256)], dtype=np.int16)


def _to_int16(pcm: np.ndarray) -> npt.NDArray[np.int32]:
    samples: npt.NDArray[np.int32] = np.clip(np.round(pcm * 32768.0), -32768, 32767).astype(np.int32)
    return samples


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """float PCM in [-1, 1) → μ-law bytes."""
    return _ULAW_ENCODE[_to_int16(pcm) + 32768].tobytes()


def alaw_encode(pcm: np.ndarray) -> bytes:
    """float PCM in [-1, 1) → A-law bytes."""
    return _ALAW_ENCODE[_to_int16(pcm) + 32768].tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes → float32 PCM."""
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32768.0


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes → float32 PCM."""
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32768.0
