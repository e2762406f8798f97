"""The two audio paths of a WebRTC call, between Opus over RTP at 48 kHz and the model's PCM at 24 kHz.

In: :class:`OpusIn` takes the caller's RTP packets as they arrive, puts them back in order, and decodes them with
libopus. A packet that has not come once ``REORDER_PACKETS`` later ones have is lost: it is recovered from the
next packet's in-band FEC where the peer sends it (browsers do), else concealed by libopus's PLC, and counted
either way, so a lost packet never becomes a gap in what the model hears. A jump of more than
``OUTAGE_PACKETS`` is an outage, not a loss: nothing is made up for it (the session core hears silence in real
time while nothing comes). aiortc's own jitter buffer is not used: after one loss it holds every later packet
some 300 ms (it releases one packet per packet received), which the caller would hear as lasting latency.

Out: :class:`VoiceOut` cuts the model's 80 ms frames into the 20 ms frames the peer's Opus encoder takes.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import opuslib_next

from ..._conversation import SAMPLE_RATE
from ...codec import StreamResampler, pcm16_decode, pcm16_encode

OPUS_RATE = 48_000
PACKET_SAMPLES = 960  # one 20 ms packet at 48 kHz
REORDER_PACKETS = 2  # later packets that declare a missing one lost (40 ms: jitter reorders within it)
OUTAGE_PACKETS = 50  # a jump longer than this (1 s) is an outage or a new stream, not a loss to conceal


@dataclasses.dataclass
class InputCounts:
    """What became of the caller's packets (``pplex_webrtc_packets_total``'s kinds)."""

    received: int = 0
    recovered: int = 0  # lost, rebuilt from the next packet's in-band FEC
    concealed: int = 0  # lost, made up by libopus's packet loss concealment
    late: int = 0  # came after their place was concealed (or twice): dropped


class OpusIn:
    """One caller's Opus stream → PCM16 at 24 kHz (``bytes``), in order, lost packets recovered or concealed."""

    def __init__(self) -> None:
        self._decoder = opuslib_next.Decoder(OPUS_RATE, 1)
        self._resample = StreamResampler(OPUS_RATE, SAMPLE_RATE, steady=True)
        self._next: int | None = None  # the sequence number due next
        self._waiting: dict[int, bytes] = {}  # packets ahead of it, by sequence number
        self._samples = PACKET_SAMPLES  # the last packet's length (a concealment's)
        self.counts = InputCounts()

    def packet(self, sequence: int, payload: bytes) -> bytes:
        """One RTP packet's ``payload`` (``sequence``: its 16-bit sequence number) → the audio it completes, if any."""
        self.counts.received += 1
        if self._next is None:
            self._next = sequence
        ahead = (sequence - self._next) & 0xFFFF
        if ahead >= 0x8000 or sequence in self._waiting:  # behind the one due: its place was filled already
            self.counts.late += 1
            return b""
        if ahead > OUTAGE_PACKETS:  # an outage (or a new stream): start again from here
            self._waiting.clear()
            self._next = sequence
        self._waiting[sequence] = payload
        pcm: list[np.ndarray] = []
        while self._waiting:
            due = self._next
            if due in self._waiting:
                pcm.append(self._decode(self._waiting.pop(due)))
            elif len(self._waiting) >= REORDER_PACKETS:
                pcm.append(self._lost((due + 1) & 0xFFFF))
            else:
                break
            self._next = (due + 1) & 0xFFFF
        return pcm16_encode(self._resample(np.concatenate(pcm))) if pcm else b""

    def _decode(self, payload: bytes) -> np.ndarray:
        try:
            pcm = self._decoder.decode(payload, 5760)  # (the longest Opus packet, 120 ms)
        except opuslib_next.OpusError:  # a packet libopus cannot read: heard as lost
            return self._conceal()
        self._samples = len(pcm) // 2 or PACKET_SAMPLES
        return pcm16_decode(pcm)

    def _lost(self, following: int) -> np.ndarray:
        """Audio for the packet due, which never came: from ``following``'s FEC if it has come, else PLC."""
        if following in self._waiting:
            try:
                pcm = self._decoder.decode(self._waiting[following], self._samples, decode_fec=True)
            except opuslib_next.OpusError:
                pcm = b""
            if pcm:
                self.counts.recovered += 1
                return pcm16_decode(pcm)
        return self._conceal()

    def _conceal(self) -> np.ndarray:
        self.counts.concealed += 1
        state = self._decoder.decoder_state  # (libopus's PLC is a decode of no data, which the class cannot ask)
        return pcm16_decode(opuslib_next.api.decoder.decode(state, None, 0, self._samples, False, channels=1))


class VoiceOut:
    """The model's PCM at 24 kHz → 20 ms frames of PCM16 at 48 kHz (``int16`` arrays), for the peer's encoder."""

    def __init__(self) -> None:
        self._resample = StreamResampler(SAMPLE_RATE, OPUS_RATE)
        self._rest = np.zeros(0, np.int16)

    def __call__(self, pcm16: bytes) -> list[np.ndarray]:
        """The frames ``pcm16`` (at 24 kHz) completes; a remainder waits for the next call."""
        samples = self._resample(pcm16_decode(pcm16))
        pending = np.concatenate([self._rest, np.round(np.clip(samples, -1, 1) * 32767).astype(np.int16)])
        whole = len(pending) // PACKET_SAMPLES * PACKET_SAMPLES
        self._rest = pending[whole:]
        return list(pending[:whole].reshape(-1, PACKET_SAMPLES))
