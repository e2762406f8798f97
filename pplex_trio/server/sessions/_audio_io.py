"""A JSON protocol's audio (a :class:`~pplex_trio.protocol.SampleFormat`) to and from the model's float32 at 24 kHz.

Shared by the OpenAI Realtime and Live sessions; each converter keeps its resampler's state, so one
serves one direction of one conversation.
"""

from __future__ import annotations

import numpy as np

from ..._conversation import SAMPLE_RATE
from ...codec import StreamResampler, alaw_decode, alaw_encode, pcm16_decode, pcm16_encode, ulaw_decode, ulaw_encode
from ...protocol import Encoding, EventError, SampleFormat

# A WebRTC call's audio as its peer connection hands it over and takes it (the socket decodes and encodes Opus).
MEDIA_AUDIO = SampleFormat(Encoding.PCM16, SAMPLE_RATE)
# What a WebRTC call's events channel is told of audio appended on it.
TRACK_ONLY = EventError(
    "over WebRTC the caller's audio is the microphone track: audio appended on the data channel is not taken",
    param="type",
    code="audio_on_track",
)

_DECODE = {Encoding.PCM16: pcm16_decode, Encoding.PCMU: ulaw_decode, Encoding.PCMA: alaw_decode}
_ENCODE = {Encoding.PCM16: pcm16_encode, Encoding.PCMU: ulaw_encode, Encoding.PCMA: alaw_encode}


class AudioIn:
    """The session's input format → float32 at 24 kHz."""

    def __init__(self, audio_format: SampleFormat):
        self.format = audio_format
        self._decode = _DECODE[audio_format.encoding]
        # Steady: each message's duration at once, for the framer (a pass-through at 24 kHz).
        self._resample = StreamResampler(audio_format.rate, SAMPLE_RATE, steady=True)

    def __call__(self, data: bytes) -> np.ndarray:
        if len(data) % self.format.sample_bytes:
            raise EventError("pcm audio must be whole 16-bit samples (an even number of bytes)", param="audio")
        return self._resample(self._decode(data))


class AudioOut:
    """float32 at 24 kHz → the session's output format."""

    def __init__(self, audio_format: SampleFormat):
        self.format = audio_format
        self._encode = _ENCODE[audio_format.encoding]
        self._resample = StreamResampler(SAMPLE_RATE, audio_format.rate)  # a pass-through at 24 kHz

    def __call__(self, pcm: np.ndarray) -> bytes:
        return self._encode(self._resample(pcm))
