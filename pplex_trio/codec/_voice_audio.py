"""A recording made ready to become a voice, as NVIDIA's voice generation prepares it.

Read with sphn (WAV, FLAC, MP3, Ogg), downmixed to mono, resampled to the
model's rate with sphn, then brought to -24 LUFS with pyloudnorm's ITU-R
BS.1770 meter: the reference's ``load_audio`` and ``normalize_audio``, so the
voice prompt made from the result is the reference's.  Every way a file can
fail to be a voice is one ``ValueError`` whose message a person understands.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TARGET_LOUDNESS = -24.0  # LUFS, as the reference's voice generation
VOICE_RATES = (8_000, 48_000)  # the sample rates a recording may come at
MIN_SECONDS = 0.4  # the loudness meter's block: a shorter clip has no loudness


def read_voice_recording(path: Path, sample_rate: int, max_seconds: float | None = None) -> np.ndarray:
    """A recording as mono float32 at ``sample_rate``.

    With ``max_seconds``, at most a little more than that is decoded, so a
    small file that claims (or holds) hours of audio costs no more than a
    clip of the limit.  Error handling: ``ValueError`` for a file sphn cannot
    read, a sample rate outside :data:`VOICE_RATES`, no audio, or audio
    longer than ``max_seconds``.
    """
    import sphn

    limit = None if max_seconds is None else max_seconds + 0.5
    try:
        pcm, rate = sphn.read(str(path), duration_sec=limit)
    except Exception as exc:  # sphn raises plain exceptions for unreadable files
        raise ValueError(f"not a recording this server can read (WAV, FLAC, MP3 or Ogg): {_short(exc, path)}") from None
    if not VOICE_RATES[0] <= rate <= VOICE_RATES[1]:
        raise ValueError(f"the recording is sampled at {rate} Hz: give one at 8 to 48 kHz")
    if pcm.ndim != 2 or pcm.shape[0] == 0 or pcm.shape[1] == 0:
        raise ValueError("the file holds no audio")
    if max_seconds is not None and pcm.shape[1] > max_seconds * rate:
        raise ValueError(
            f"the recording is longer than {max_seconds:g} s: a voice needs a few seconds of speech "
            "(NVIDIA's voices are 4 s); cut it shorter"
        )
    mono = pcm.mean(axis=0, keepdims=True, dtype=np.float32) if pcm.shape[0] > 1 else pcm[:1]
    if rate != sample_rate:
        mono = sphn.resample(mono, src_sample_rate=rate, dst_sample_rate=sample_rate)
    return np.asarray(mono[0], dtype=np.float32)


def normalize_loudness(pcm: np.ndarray, sample_rate: int, target: float = TARGET_LOUDNESS) -> np.ndarray:
    """``pcm`` brought to ``target`` LUFS (float32).

    Error handling: ``ValueError`` for a recording with no measurable
    loudness (silent, or shorter than the meter's 0.4 s block): its gain
    would be infinite, and NaN would reach the model.
    """
    import pyloudnorm

    seconds = pcm.size / sample_rate
    loudness = pyloudnorm.Meter(sample_rate).integrated_loudness(pcm) if seconds >= MIN_SECONDS else -np.inf
    if not np.isfinite(loudness):
        raise ValueError(
            f"the recording is silent or shorter than {MIN_SECONDS:g} s ({seconds:.2f} s of audio): "
            "it has no loudness to bring to -24 LUFS; record a few seconds of the voice"
        )
    # pyloudnorm.normalize.loudness's gain, without its warning about peaks over full scale (a voice
    # prompt is encoded, not played: the reference keeps such peaks too).
    gain = np.power(10.0, (target - loudness) / 20.0)
    return np.asarray(gain * pcm, dtype=np.float32)


def voice_audio(path: Path, sample_rate: int, max_seconds: float | None = None) -> np.ndarray:
    """:func:`read_voice_recording` then :func:`normalize_loudness`: what a voice is made from."""
    return normalize_loudness(read_voice_recording(path, sample_rate, max_seconds), sample_rate)


def load_libraries() -> None:
    """Import sphn and pyloudnorm now: pyloudnorm brings SciPy, about 2 s of import that would hold the
    interpreter (and stall a running server's ticks) if it came with the first clip."""
    import pyloudnorm  # noqa: F401
    import sphn  # noqa: F401


def _short(exc: Exception, path: Path) -> str:
    """sphn's reason, without the file's path (a server's temporary file is nobody's business)."""
    text = " ".join(str(exc).replace(f'"{path}": ', "").replace(str(path), "the file").split())
    return text[:160] or type(exc).__name__
