"""A WebRTC call's audio paths without a network: ``OpusIn`` (the caller's packets → the model's PCM, in order,
losses recovered or concealed and counted), ``VoiceOut`` (the model's 80 ms frames → 20 ms frames) and ``Voice``
(those frames waiting to go, one Opus packet at a time).

The packets are made by libopus itself (``opuslib_next``, as a browser's encoder would make them), from real
speech; what comes out is measured in samples: a lost packet must never become a gap."""

from __future__ import annotations

import math

import numpy as np
import opuslib_next
import pytest
import soxr

from _helpers.audio import best_lag, correlation_at
from pplex_trio.server.webrtc._media import (
    HOLD_SECONDS,
    OUTAGE_PACKETS,
    PACKET_SAMPLES,
    PLAYED_TOGETHER,
    VOICE_QUEUE_PACKETS,
    InputCounts,
    OpusIn,
    OpusOut,
    Voice,
    VoiceOut,
)

PACKETS = 60  # 1.2 s
AT_48K = 960  # one packet's samples as a browser encodes them (Opus at 48 kHz)


@pytest.fixture(scope="module")
def voice(speech) -> np.ndarray:
    """1.2 s of the caller's speech at 48 kHz (int16), a whole number of packets."""
    return np.round(speech[: PACKETS * AT_48K] * 32767).astype(np.int16)


def packets(voice: np.ndarray, *, fec: bool = False) -> list[bytes]:
    encoder = opuslib_next.Encoder(48_000, 1, opuslib_next.APPLICATION_VOIP)
    if fec:  # (what a browser's offer with useinbandfec=1 gets, once it sees loss)
        encoder.inband_fec, encoder.packet_loss_perc = 1, 10
    return [encoder.encode(voice[k * AT_48K : (k + 1) * AT_48K].tobytes(), AT_48K) for k in range(PACKETS)]


def fed(opus: OpusIn, order: list[int], payloads: list[bytes], *, first: int = 65_530, late: dict | None = None):
    """What ``opus`` plays of the packets in ``order`` (indices into ``payloads``; sequence numbers from ``first``,
    wrapping past 65535 on the way), each coming at its place's 20 ms time in ``order`` plus what ``late`` says
    (index → seconds), played as their times come: float32 at 24 kHz."""
    late = late or {}
    arrivals = sorted((n * 0.02 + late.get(k, 0.0), n, k) for n, k in enumerate(order))
    out = []
    for at, _, k in arrivals:
        out.append(opus.due(at))
        opus.packet((first + k) & 0xFFFF, payloads[k], at)
        out.append(opus.due(at))
    out.append(opus.due(math.inf))
    return np.frombuffer(b"".join(out), "<i2").astype(np.float32) / 32768


def test_in_order_every_packet_is_heard(voice):
    opus = OpusIn()
    heard = fed(opus, list(range(PACKETS)), packets(voice))
    expected = soxr.resample(voice.astype(np.float32) / 32768, 48_000, 24_000)
    assert heard.size == PACKETS * PACKET_SAMPLES  # 20 ms each, at 24 kHz: no sample more or less
    lag = best_lag(expected, heard, 0, 480)[0]  # (Opus's own look-ahead)
    assert correlation_at(expected, heard, lag) > 0.9, lag  # (through Opus at its default rate)
    assert opus.counts == InputCounts(received=PACKETS)


def test_each_packet_plays_at_the_steady_pace_a_loss_included(voice):
    """Packet ``n`` plays ``HOLD_SECONDS`` after the stream's earliest pace (here: packet 0 came at 0), whether it
    came early, came late within the hold, or was lost (then made up at its time, not later); they go to the
    session ``PLAYED_TOGETHER`` at a time, at the time of the last of them."""
    payloads = packets(voice)
    opus = OpusIn()
    came = {0: 0.0, 1: 0.021, 2: 0.045, 4: 0.080, 3: 0.095, 6: 0.121, 7: 0.14}  # 3 late (within the hold), 5 lost
    played: dict[float, int] = {}
    times = sorted({*came.values(), *(n * 0.02 + HOLD_SECONDS for n in range(8))})
    for now in times:
        assert opus.due(now - 1e-6) == b""  # (never early)
        for k, at in came.items():
            if at == now:
                opus.packet(k, payloads[k], now)
        if audio := opus.due(now + 1e-9):
            played[round(now, 6)] = len(audio) // 2 // PACKET_SAMPLES
    together = PLAYED_TOGETHER
    expected = {round((n + together - 1) * 0.02 + HOLD_SECONDS, 6): together for n in range(0, 8, together)}
    assert played == expected
    assert opus.counts == InputCounts(received=7, concealed=1)


def test_packets_reordered_within_the_hold_are_put_back_in_order(voice):
    payloads = packets(voice)
    straight = fed(OpusIn(), list(range(PACKETS)), payloads)
    opus = OpusIn()
    assert np.array_equal(fed(opus, list(range(PACKETS)), payloads, late={5: 0.035, 20: 0.025, 40: 0.039}), straight)
    assert opus.counts == InputCounts(received=PACKETS)


def test_a_lost_packet_is_concealed_not_a_gap(voice):
    payloads = packets(voice)
    opus = OpusIn()
    heard = fed(opus, [k for k in range(PACKETS) if k not in (10, 30, 31)], payloads)
    assert heard.size == PACKETS * PACKET_SAMPLES  # three packets lost: the same length
    assert opus.counts == InputCounts(received=PACKETS - 3, concealed=3)
    straight = fed(OpusIn(), list(range(PACKETS)), payloads)
    after = slice(33 * PACKET_SAMPLES + 2400, None)  # 100 ms on from the losses: the same audio again
    assert correlation_at(straight[after], heard[after], 0) > 0.95


def test_a_lost_packet_is_rebuilt_from_the_next_ones_fec(voice):
    payloads = packets(voice, fec=True)
    opus = OpusIn()
    heard = fed(opus, [k for k in range(PACKETS) if k != 25], payloads)
    assert heard.size == PACKETS * PACKET_SAMPLES
    assert opus.counts == InputCounts(received=PACKETS - 1, recovered=1)


def test_a_packet_after_its_time_is_dropped(voice):
    payloads = packets(voice)
    opus = OpusIn()
    order = [*range(PACKETS), 5]  # and a duplicate of 5, at the end
    heard = fed(opus, order, payloads, late={10: 0.1})  # 10 comes 100 ms late: its place was concealed
    assert heard.size == PACKETS * PACKET_SAMPLES
    assert opus.counts == InputCounts(received=PACKETS + 1, concealed=1, late=2)


def test_a_stall_is_waited_for_and_the_pace_starts_anew(voice):
    """The network stalls 300 ms and then delivers what it held at once: nothing is made up (nothing was lost),
    and the pace starts again from the first that came, the rest following at 20 ms."""
    payloads = packets(voice)
    opus = OpusIn()
    stalled = {k: 0.29 - 0.02 * (k - 10) + k * 1e-6 for k in range(10, 25)}  # 10..24 come at 0.49 s, in order
    heard = fed(opus, list(range(30)), payloads, late=stalled)
    assert heard.size == 30 * PACKET_SAMPLES and opus.counts == InputCounts(received=30)
    assert opus.due(math.inf) == b""  # (nothing left waiting)


def test_an_outage_is_not_made_up(voice):
    """A jump past ``OUTAGE_PACKETS`` (a network down for seconds, a new stream) starts again: what was held plays
    at once, nothing is concealed for the gap (the session core hears silence in real time while nothing comes)."""
    payloads = packets(voice)
    opus = OpusIn()
    first = fed(opus, list(range(10)), payloads, first=100)
    later = fed(opus, list(range(10, 20)), payloads, first=100 + OUTAGE_PACKETS + 1)
    assert first.size + later.size == 20 * PACKET_SAMPLES
    assert opus.counts == InputCounts(received=20)


def test_the_models_voice_goes_out_in_20_ms_frames():
    out = VoiceOut()
    ramp = (np.arange(1920 * 3) % 200 - 100).astype("<i2")  # 240 ms at 24 kHz, in three of the model's frames
    frames = [frame for k in range(3) for frame in out(ramp[k * 1920 : (k + 1) * 1920].tobytes())]
    assert len(frames) == 12 and all(frame.dtype == np.int16 and frame.size == 480 for frame in frames)
    assert np.array_equal(np.concatenate(frames), ramp)
    assert out(ramp[:300].tobytes()) == [] and out(ramp[:300].tobytes())[0].size == 480  # a remainder waits


def test_the_voice_waits_in_order_and_the_oldest_go_past_half_a_second(voice):
    """``Voice``: the frames queued go out one packet each, in order, the silence packet when none waits; past
    ``VOICE_QUEUE_PACKETS`` (500 ms) waiting, the oldest go, counted."""
    track = Voice()
    silent = [np.zeros(PACKET_SAMPLES, np.int16)] * 5  # the oldest: these go
    said = [voice[k * AT_48K : (k + 1) * AT_48K : 2] for k in range(VOICE_QUEUE_PACKETS)]
    track.push(silent + said)
    assert track.dropped == 5
    packets = [track.next_packet() for _ in range(VOICE_QUEUE_PACKETS + 2)]
    silence = OpusOut().silence
    assert [packet == silence for packet in packets] == [False] * VOICE_QUEUE_PACKETS + [True, True]
    decoder = opuslib_next.Decoder(24_000, 1)
    heard = np.frombuffer(b"".join(decoder.decode(packet, 2880) for packet in packets), "<i2")
    assert heard.size == (VOICE_QUEUE_PACKETS + 2) * PACKET_SAMPLES  # 20 ms each
    expected = np.concatenate(said).astype(np.float32) / 32768
    lag = best_lag(expected, heard[: expected.size].astype(np.float32) / 32768, 0, 480)[0]
    assert correlation_at(expected, heard[: expected.size].astype(np.float32) / 32768, lag) > 0.9  # in order
