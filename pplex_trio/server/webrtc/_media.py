"""The two audio paths of a WebRTC call, between Opus over RTP and the model's PCM at 24 kHz.

In: :class:`OpusIn` takes the caller's RTP packets as they arrive, puts them back in order, and decodes them with
libopus, straight at the model's 24 kHz (Opus decodes at any of its rates: no resampler, no delay), at a steady
pace: each packet plays ``HOLD_SECONDS`` (50 ms: 40 of jitter, and the loop's own lateness) after the earliest its
stream's 20 ms rhythm lets it come (the jitter buffer; the call clock's next tick plays it: ``_rtp.py``). Jitter
reorders packets within the hold; a packet whose time has come while a later one has is lost: it is recovered from
the next packet's in-band FEC where the peer sends it (browsers do), else concealed by libopus's PLC, and counted
either way, at its time: a lost packet is never a gap in what the model hears, nor late (the session's framing would
hear that as jitter, and keep the caller a tick later for seconds). A packet that has not come with none after it is
waited for: when it comes after its time (the network got slower, or stalled) the pace starts anew from it. A jump
of more than ``OUTAGE_PACKETS`` is an outage, not a loss: nothing is made up for it (the session core hears silence
in real time while nothing comes). aiortc's own jitter buffer is not used: after one loss it holds every later
packet some 300 ms (it releases one packet per packet received), which the caller would hear as lasting latency.

Out: :class:`VoiceOut` cuts the model's 80 ms frames into 20 ms frames, :class:`Voice` holds them until their
time and :class:`OpusOut` encodes each with libopus as it goes (mono at the model's 24 kHz, as the Moshi
protocol's Opus is made; aiortc's own encoder, which resamples to 48 kHz stereo on a worker thread for every
packet, costs several times as much).
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import math

import numpy as np
import opuslib_next

from ..._conversation import SAMPLE_RATE
from ...codec import OPUS_BITRATE, OPUS_COMPLEXITY

PACKET_SAMPLES = SAMPLE_RATE // 50  # one 20 ms packet (as browsers send them, and as we do), at the model's rate
opus_decode = opuslib_next.api.decoder.libopus_decode  # (ctypes: it lets the GIL go while it decodes)
PACKET_SECONDS = PACKET_SAMPLES / SAMPLE_RATE
PLAYED_TOGETHER = 2  # packets handed to the session at once (40 ms, as WebSocket clients send: half the hand-offs)
HOLD_SECONDS = 0.050  # a packet plays this long after the earliest its stream's pace lets it come (see above)
OUTAGE_PACKETS = 50  # a jump longer than this (1 s) is an outage or a new stream, not a loss to conceal
VOICE_QUEUE_PACKETS = 25  # 500 ms of the model's voice waiting to be played: beyond it the oldest goes


@dataclasses.dataclass
class InputCounts:
    """What became of the caller's packets (``pplex_webrtc_packets_total``'s kinds)."""

    received: int = 0
    recovered: int = 0  # lost, rebuilt from the next packet's in-band FEC
    concealed: int = 0  # lost, made up by libopus's packet loss concealment
    late: int = 0  # came after their place was concealed (or twice): dropped


class OpusIn:
    """One caller's Opus stream → PCM16 at 24 kHz (``bytes``), played at a steady pace, lost packets recovered or
    concealed. Sans-IO: :meth:`packet` takes each packet with the time it came, :meth:`due` gives the audio whose
    time has come (the call clock asks every 20 ms)."""

    def __init__(self) -> None:
        self._decoder = opuslib_next.Decoder(SAMPLE_RATE, 1)
        self._pcm = (ctypes.c_int16 * (6 * PACKET_SAMPLES))()  # (the longest Opus packet, 120 ms)
        self._next: int | None = None  # the sequence number due next
        self._plays_at = -math.inf  # when it plays
        self._waiting: dict[int, bytes] = {}  # packets ahead of it, by sequence number
        self._played: list[bytes] = []  # what an outage's start played at once, for the next due()
        self._samples = PACKET_SAMPLES  # the last packet's length (a concealment's)
        self.counts = InputCounts()

    def packet(self, sequence: int, payload: bytes, now: float) -> None:
        """One RTP packet's ``payload`` (``sequence``: its 16-bit sequence number), come at ``now`` (seconds)."""
        self.counts.received += 1
        if self._next is None:
            self._next = sequence
        ahead = (sequence - self._next) & 0xFFFF
        if ahead >= 0x8000 or sequence in self._waiting:  # behind the one due: its place was filled already
            self.counts.late += 1
            return
        if ahead > OUTAGE_PACKETS:  # an outage (or a new stream): what was held plays at once, then on from here
            held = sorted(self._waiting, key=lambda waiting: (waiting - sequence) & 0xFFFF)
            self._played.extend(self._decode(self._waiting.pop(waiting)) for waiting in held)
            self._next, ahead = sequence, 0
        stalled = (
            not self._waiting and now > self._plays_at + ahead * PACKET_SECONDS
        )  # (nothing waits, its time passed)
        self._waiting[sequence] = payload
        # The time the one due plays, by this packet: HOLD_SECONDS after it came, less its place in the line. The
        # earliest such time sets the pace; after a stall the pace starts anew from the packet that ends it.
        at = now + HOLD_SECONDS - ahead * PACKET_SECONDS
        self._plays_at = at if stalled else min(self._plays_at, at)

    def due(self, now: float) -> bytes:
        """The audio whose time has come by ``now``, ``PLAYED_TOGETHER`` packets at a time: in order, a packet
        missing in it (a later one came) recovered or concealed. A missing packet with none after it waits: it
        may come late."""
        pcm, self._played = self._played, []
        while self._waiting and self._plays_at + (PLAYED_TOGETHER - 1) * PACKET_SECONDS <= now:
            for _ in range(PLAYED_TOGETHER):
                if not self._waiting:
                    break
                due = self._next
                assert due is not None
                if due in self._waiting:
                    pcm.append(self._decode(self._waiting.pop(due)))
                else:
                    pcm.append(self._lost((due + 1) & 0xFFFF))
                self._next, self._plays_at = (due + 1) & 0xFFFF, self._plays_at + PACKET_SECONDS
        return b"".join(pcm)

    def _decode(self, payload: bytes) -> bytes:
        try:
            pcm = self._libopus(payload, len(self._pcm), fec=False)
        except opuslib_next.OpusError:  # a packet libopus cannot read: heard as lost
            return self._conceal()
        self._samples = len(pcm) // 2 or PACKET_SAMPLES
        return pcm

    def _lost(self, following: int) -> bytes:
        """Audio for the packet due, which never came: from ``following``'s FEC if it has come, else PLC."""
        if following in self._waiting and _has_fec(self._waiting[following]):
            try:
                pcm = self._libopus(self._waiting[following], self._samples, fec=True)
            except opuslib_next.OpusError:
                pcm = b""
            if pcm:
                self.counts.recovered += 1
                return pcm
        return self._conceal()

    def _conceal(self) -> bytes:
        self.counts.concealed += 1
        return self._libopus(None, self._samples, fec=False)  # (libopus's PLC: a decode of no data)

    def _libopus(self, payload: bytes | None, samples: int, *, fec: bool) -> bytes:
        """libopus's ``opus_decode`` into our own buffer (the binding's own call copies it sample by sample)."""
        state = self._decoder.decoder_state
        length = 0 if payload is None else len(payload)
        decoded = opus_decode(state, payload, length, self._pcm, samples, int(fec))
        if decoded < 0:
            raise opuslib_next.OpusError(decoded)
        return ctypes.string_at(self._pcm, 2 * decoded)


def _has_fec(payload: bytes) -> bool:
    """Whether an Opus packet of one frame carries the one before it again (SILK's LBRR, the in-band FEC): its
    flag is a plain bit of the frame's first byte (RFC 6716, 4.2.3; libopus 1.5's ``opus_packet_has_lbrr``, which
    the libopus of older systems lacks). Asked of a packet without it, libopus conceals instead, so the count of
    recoveries needs to know."""
    if len(payload) < 2 or payload[0] & 0x3 != 0:  # (several frames in one packet: not what WebRTC sends)
        return False
    config = payload[0] >> 3
    if config >= 16:  # CELT only: no SILK layer, no LBRR
        return False
    frames = max(1, (10, 20, 40, 60)[config % 4] // 20) if config < 12 else 1  # SILK frames of 20 ms in it
    channels = 2 if payload[0] & 0x4 else 1
    flags = payload[1]
    return any((flags >> (7 - (frames + 1) * channel - frames)) & 1 for channel in range(channels))


class VoiceOut:
    """The model's PCM16 at 24 kHz → 20 ms frames (``int16`` arrays), for :class:`OpusOut`."""

    def __init__(self) -> None:
        self._rest = np.zeros(0, np.int16)

    def __call__(self, pcm16: bytes) -> list[np.ndarray]:
        """The frames ``pcm16`` completes; a remainder (none, for the model's 80 ms frames) waits for the next."""
        pending = np.concatenate([self._rest, np.frombuffer(pcm16, "<i2")])
        whole = len(pending) // PACKET_SAMPLES * PACKET_SAMPLES
        self._rest = pending[whole:]
        return list(pending[:whole].reshape(-1, PACKET_SAMPLES))


class Voice:
    """The model's voice waiting to be played: 20 ms frames (``int16`` at 24 kHz) in, one Opus packet out at a
    time (silence when none waits); beyond ``VOICE_QUEUE_PACKETS`` waiting, the oldest go (counted)."""

    def __init__(self) -> None:
        self._frames: collections.deque[np.ndarray] = collections.deque()
        self._opus = OpusOut()
        self.dropped = 0

    def push(self, frames: list[np.ndarray]) -> None:
        """Queue frames to play."""
        self._frames.extend(frames)
        while len(self._frames) > VOICE_QUEUE_PACKETS:
            self._frames.popleft()
            self.dropped += 1

    def next_packet(self) -> bytes:
        """The next 20 ms packet to send."""
        return self._opus(self._frames.popleft()) if self._frames else self._opus.silence


class OpusOut:
    """20 ms frames of the model's voice (``int16`` at 24 kHz) → Opus packets; digital silence (what the model
    says while waiting, what the track plays when nothing waits) is one packet, made once."""

    def __init__(self) -> None:
        self._encoder = opuslib_next.Encoder(SAMPLE_RATE, 1, opuslib_next.APPLICATION_AUDIO)
        self._encoder.complexity, self._encoder.bitrate = OPUS_COMPLEXITY, OPUS_BITRATE
        self.silence: bytes = self._encoder.encode(bytes(2 * PACKET_SAMPLES), PACKET_SAMPLES)

    def __call__(self, frame: np.ndarray) -> bytes:
        """One frame's packet."""
        if not frame.any():
            return self.silence
        packet: bytes = self._encoder.encode(frame.tobytes(), PACKET_SAMPLES)
        return packet
