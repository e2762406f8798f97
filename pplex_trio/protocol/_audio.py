"""The audio a JSON protocol carries in base64 (OpenAI Realtime, Live): an encoding at a sample rate."""

from __future__ import annotations

import dataclasses
import enum


class Encoding(enum.Enum):
    """What the bytes are, by their media type: 16-bit little-endian PCM, or G.711 μ-law / A-law."""

    PCM16 = "audio/pcm"
    PCMU = "audio/pcmu"
    PCMA = "audio/pcma"


@dataclasses.dataclass(frozen=True)
class SampleFormat:
    """Mono audio in ``encoding`` at ``rate`` Hz."""

    encoding: Encoding
    rate: int

    @property
    def sample_bytes(self) -> int:
        """Bytes per sample: 2 for PCM16, 1 for G.711."""
        return 2 if self.encoding is Encoding.PCM16 else 1
