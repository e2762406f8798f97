"""Opus encoding with libopus through ctypes, wrapped in our Ogg muxer.

sphn's ``OpusStreamWriter`` holds the GIL for its whole ~1.4 ms encode of an
80 ms frame at libopus' highest complexity.  Calling libopus directly
(``opuslib_next``, ctypes over the system's libopus) lets us pick complexity
5 (~0.3 ms a frame, and a better SNR on speech than 10 at our bitrate) and
keeps the GIL free while it encodes.  The wire format is sphn's: an Ogg Opus
stream at 24 kHz, one 40 ms packet per page, header pages first.

This module is light on purpose: the codec child processes import it.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from .._conversation import SAMPLE_RATE
from ._ogg_writer import OggOpusMuxer

logger = logging.getLogger(__name__)

PACKET_SAMPLES = SAMPLE_RATE // 25  # 40 ms: one packet per page, two pages per frame, as sphn writes
OPUS_COMPLEXITY = 5
OPUS_BITRATE = 32_000


class OpusWriter(Protocol):
    """What encodes one stream's PCM to Ogg Opus pages (:class:`LibopusWriter`, or a fake in tests)."""

    def append_pcm(self, pcm: np.ndarray) -> bytes:
        """Encode float32 mono PCM (a multiple of 20 ms); return whole Ogg pages."""


class LibopusWriter:
    """libopus (ctypes) + our Ogg muxer."""

    def __init__(self, complexity: int = OPUS_COMPLEXITY) -> None:
        import opuslib_next

        self._encoder = opuslib_next.Encoder(SAMPLE_RATE, 1, opuslib_next.APPLICATION_AUDIO)
        self._encoder.complexity = complexity
        self._encoder.bitrate = OPUS_BITRATE
        pre_skip = self._encoder.lookahead * (48_000 // SAMPLE_RATE)
        self._muxer = OggOpusMuxer(input_rate=SAMPLE_RATE, pre_skip_48k=pre_skip)

    def append_pcm(self, pcm: np.ndarray) -> bytes:
        """Encode float32 mono PCM (whole 20 ms packets; a partial one at the end is dropped); return whole Ogg pages,
        the headers first on the first call.
        """
        data = np.ascontiguousarray(pcm, dtype=np.float32)
        packets = [
            self._encoder.encode_float(data[i : i + PACKET_SAMPLES].tobytes(), PACKET_SAMPLES)
            for i in range(0, data.size - PACKET_SAMPLES + 1, PACKET_SAMPLES)
        ]
        return self._muxer.pages(packets, samples_48k_per_packet=PACKET_SAMPLES * 48_000 // SAMPLE_RATE, per_page=1)


def libopus_available() -> bool:
    """Whether libopus loads here (the reason it does not is logged at debug level)."""
    try:
        LibopusWriter()
    except Exception as exc:  # opuslib_next raises a bare Exception when libopus is missing
        logger.debug("libopus not usable: %s", exc)
        return False
    return True
