"""A WebRTC call's audio paths without a network: ``OpusIn`` (the caller's packets → the model's PCM, in order,
losses recovered or concealed and counted) and ``VoiceOut`` (the model's 80 ms frames → 20 ms frames at 48 kHz).

The packets are made by libopus itself (``opuslib_next``, as a browser's encoder would make them), from real
speech; what comes out is measured in samples: a lost packet must never become a gap."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import numpy as np
import opuslib_next
import pytest
import soxr

from _helpers.audio import best_lag, correlation_at
from pplex_trio.server.webrtc._media import (
    HOLD_PACKETS,
    OUTAGE_PACKETS,
    PACKET_SAMPLES,
    InputCounts,
    OpusIn,
    OpusOut,
    VoiceOut,
)
from pplex_trio.server.webrtc._peer import VOICE_QUEUE_PACKETS, PacedVoice

PACKETS = 60  # 1.2 s
AT_48K = 960  # one packet's samples as a browser encodes them (Opus at 48 kHz)
PLAYED = PACKETS - HOLD_PACKETS  # the last are held until more come


@pytest.fixture(scope="module")
def voice(speech) -> np.ndarray:
    """1.2 s of the caller's speech at 48 kHz (int16), a whole number of packets."""
    return np.round(speech[: PACKETS * AT_48K] * 32767).astype(np.int16)


def packets(voice: np.ndarray, *, fec: bool = False) -> list[bytes]:
    encoder = opuslib_next.Encoder(48_000, 1, opuslib_next.APPLICATION_VOIP)
    if fec:  # (what a browser's offer with useinbandfec=1 gets, once it sees loss)
        encoder.inband_fec, encoder.packet_loss_perc = 1, 10
    return [encoder.encode(voice[k * AT_48K : (k + 1) * AT_48K].tobytes(), AT_48K) for k in range(PACKETS)]


def fed(opus: OpusIn, order: list[int], payloads: list[bytes], first: int = 65_530) -> np.ndarray:
    """What ``opus`` gives for the packets in ``order`` (indices into ``payloads``; sequence numbers from
    ``first``, wrapping past 65535 on the way), as float32 at 24 kHz."""
    out = b"".join(opus.packet((first + k) & 0xFFFF, payloads[k]) for k in order)
    return np.frombuffer(out, "<i2").astype(np.float32) / 32768


def test_in_order_every_packet_is_heard(voice):
    opus = OpusIn()
    heard = fed(opus, list(range(PACKETS)), packets(voice))
    expected = soxr.resample(voice.astype(np.float32) / 32768, 48_000, 24_000)
    assert heard.size == PLAYED * PACKET_SAMPLES  # 20 ms each, at 24 kHz: no sample more or less
    lag = best_lag(expected, heard, 0, 480)[0]  # (Opus's own look-ahead)
    assert correlation_at(expected, heard, lag) > 0.9, lag  # (through Opus at its default rate)
    assert opus.counts == InputCounts(received=PACKETS)


def test_packets_reordered_within_the_window_are_put_back_in_order(voice):
    payloads = packets(voice)
    straight = fed(OpusIn(), list(range(PACKETS)), payloads)
    order = list(range(PACKETS))
    for k in (5, 20, 40):  # each swapped with the next: one packet late by one
        order[k], order[k + 1] = order[k + 1], order[k]
    opus = OpusIn()
    assert np.array_equal(fed(opus, order, payloads), straight)
    assert opus.counts == InputCounts(received=PACKETS)


def test_a_lost_packet_is_concealed_not_a_gap(voice):
    payloads = packets(voice)
    opus = OpusIn()
    heard = fed(opus, [k for k in range(PACKETS) if k not in (10, 30, 31)], payloads)
    assert heard.size == PLAYED * PACKET_SAMPLES  # three packets lost: the same length
    assert opus.counts == InputCounts(received=PACKETS - 3, concealed=3)
    straight = fed(OpusIn(), list(range(PACKETS)), payloads)
    after = slice(33 * PACKET_SAMPLES + 2400, None)  # 100 ms on from the losses: the same audio again
    assert correlation_at(straight[after], heard[after], 0) > 0.95


def test_a_lost_packet_is_rebuilt_from_the_next_ones_fec(voice):
    payloads = packets(voice, fec=True)
    opus = OpusIn()
    heard = fed(opus, [k for k in range(PACKETS) if k != 25], payloads)
    assert heard.size == PLAYED * PACKET_SAMPLES
    assert opus.counts == InputCounts(received=PACKETS - 1, recovered=1)


def test_a_packet_after_its_place_was_filled_is_dropped(voice):
    payloads = packets(voice)
    opus = OpusIn()
    order = [k for k in range(PACKETS) if k != 10]
    order.insert(order.index(13), 10)  # comes three packets late: its place was concealed already
    order.append(5)  # and a duplicate
    heard = fed(opus, order, payloads)
    assert heard.size == PLAYED * PACKET_SAMPLES
    assert opus.counts == InputCounts(received=PACKETS + 1, concealed=1, late=2)


def test_an_outage_is_not_made_up(voice):
    """A jump past ``OUTAGE_PACKETS`` (a network down for seconds, a new stream) starts again: nothing is
    concealed for it (the session core hears silence in real time while nothing comes)."""
    payloads = packets(voice)
    opus = OpusIn()
    first = fed(opus, list(range(10)), payloads, first=100)
    later = b"".join(opus.packet(100 + 10 + OUTAGE_PACKETS + 1 + k, payloads[10 + k]) for k in range(10))
    assert first.size + len(later) // 2 == (20 - HOLD_PACKETS) * PACKET_SAMPLES  # (what was held played)
    assert opus.counts == InputCounts(received=20)


def test_the_models_voice_goes_out_in_20_ms_frames():
    out = VoiceOut()
    ramp = (np.arange(1920 * 3) % 200 - 100).astype("<i2")  # 240 ms at 24 kHz, in three of the model's frames
    frames = [frame for k in range(3) for frame in out(ramp[k * 1920 : (k + 1) * 1920].tobytes())]
    assert len(frames) == 12 and all(frame.dtype == np.int16 and frame.size == PACKET_SAMPLES for frame in frames)
    assert np.array_equal(np.concatenate(frames), ramp)
    assert out(ramp[:500].tobytes())[0].size == PACKET_SAMPLES and np.array_equal(out(b"")[0:0], [])  # a remainder


def test_the_voice_is_played_at_real_time_never_ahead(voice):
    """``PacedVoice``, as aiortc's sender pulls it: Opus packets of the frames queued at once come out one per 20 ms
    from the first, never earlier, the silence packet when none waits; past 500 ms waiting, the oldest go."""

    async def pull() -> tuple[list[float], list[bytes], PacedVoice]:
        track = PacedVoice()
        silent = [np.zeros(PACKET_SAMPLES, np.int16)] * 5  # the oldest: these go
        said = [(voice[k * AT_48K : (k + 1) * AT_48K : 2]) for k in range(VOICE_QUEUE_PACKETS)]
        track.push(silent + said)
        loop = asyncio.get_running_loop()
        times, packets = [], []
        for k in range(VOICE_QUEUE_PACKETS + 2):
            packet = await track.recv()
            times.append(loop.time())
            packets.append(bytes(packet))
            assert packet.pts == k * PACKET_SAMPLES and packet.time_base == Fraction(1, 24_000)
        return times, packets, track

    times, packets, track = asyncio.run(pull())
    assert track.dropped == 5
    silence = OpusOut().silence
    assert [packet == silence for packet in packets] == [False] * VOICE_QUEUE_PACKETS + [True, True]
    decoder = opuslib_next.Decoder(24_000, 1)
    assert all(len(decoder.decode(packet, 2880)) == 2 * PACKET_SAMPLES for packet in packets)  # 20 ms each
    assert all(times[k] - times[0] >= k * 0.02 - 1e-3 for k in range(len(times)))
