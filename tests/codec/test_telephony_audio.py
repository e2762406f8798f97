"""G.711 against an independent reference (CPython's audioop), the resampler, the voice-activity detector."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pplex_trio.codec._g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from pplex_trio.codec._resample import StreamResampler
from pplex_trio.codec._vad import EnergyVAD

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    audioop = pytest.importorskip("audioop")  # CPython's C implementation (to 3.12): the reference

EVERY_SAMPLE = np.arange(-32768, 32768, dtype=np.int16)


@pytest.mark.parametrize("encode, reference", [(ulaw_encode, "lin2ulaw"), (alaw_encode, "lin2alaw")])
def test_encoding_every_16_bit_sample_matches_the_reference(encode, reference):
    expected = getattr(audioop, reference)(EVERY_SAMPLE.tobytes(), 2)
    assert encode(EVERY_SAMPLE.astype(np.float32) / 32768.0) == expected


@pytest.mark.parametrize("decode, reference", [(ulaw_decode, "ulaw2lin"), (alaw_decode, "alaw2lin")])
def test_decoding_every_byte_matches_the_reference(decode, reference):
    every_byte = bytes(range(256))
    expected = np.frombuffer(getattr(audioop, reference)(every_byte, 2), dtype="<i2")
    assert np.array_equal(np.round(decode(every_byte) * 32768).astype(np.int16), expected)


def test_out_of_range_input_saturates():
    assert ulaw_encode(np.array([2.0, -2.0], np.float32)) == ulaw_encode(np.array([32767 / 32768, -1.0], np.float32))


def tone(hz: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


def peak_hz(signal: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(signal * np.hanning(signal.size)))
    return float(np.argmax(spectrum) * rate / signal.size)


def test_the_resampler_streams_in_80_ms_chunks_and_keeps_the_signal():
    up, down = StreamResampler(8_000, 24_000), StreamResampler(24_000, 8_000)
    sent = tone(1_000, 8_000, 2.0)
    at_24k = np.concatenate([up(sent[i : i + 640]) for i in range(0, sent.size, 640)])
    back = np.concatenate([down(at_24k[i : i + 1920]) for i in range(0, at_24k.size, 1920)])
    assert abs(at_24k.size - 3 * sent.size) <= 3 * 640 and abs(back.size - sent.size) <= 2 * 640  # a filter's delay
    assert peak_hz(at_24k[4800:], 24_000) == pytest.approx(1_000, abs=2)
    steady = at_24k[4800:-4800]
    assert np.sqrt(2) * steady.std() == pytest.approx(0.5, abs=0.01)  # flat in the telephone band
    # Up and down again, the signal comes back whole, shifted by the filters' delay.
    window = back[4000:12000]
    scores = [np.corrcoef(window, sent[4000 - lag : 12000 - lag])[0, 1] for lag in range(0, 400)]
    assert max(scores) > 0.999, max(scores)


@pytest.mark.parametrize("rate, chunk", [(8_000, 800), (8_000, 160), (16_000, 1_600)])  # Exotel's, Twilio's
def test_a_steady_resampler_gives_each_chunk_its_duration_a_constant_delay_behind(rate, chunk):
    sent = (0.1 * np.random.default_rng(3).standard_normal(30 * rate)).astype(np.float32)
    plain, steady = StreamResampler(rate, 24_000), StreamResampler(rate, 24_000, steady=True)
    blocks = [plain(sent[i : i + chunk]) for i in range(0, sent.size, chunk)]
    pieces = [steady(sent[i : i + chunk]) for i in range(0, sent.size, chunk)]
    # soxr alone: blocks of its own size, so chunk after chunk gives more or less than its duration.
    ratio = 24_000 // rate if rate == 8_000 else 1.5
    assert len({b.size for b in blocks[10:]}) > 1
    # The most soxr held back after any chunk (3 × in - out) is what the steady one holds back always.
    held = max(ratio * chunk * (n + 1) - sum(b.size for b in blocks[: n + 1]) for n in range(len(blocks)))
    assert 0 <= steady.delay - held <= 3 * ratio
    settled = next(n for n, p in enumerate(pieces) if p.size)  # (once that much is in)
    assert {p.size for p in pieces[settled + 1 :]} == {ratio * chunk}
    # The same signal, sample for sample.
    out, reference = np.concatenate(pieces), np.concatenate(blocks)
    assert np.array_equal(out, reference[: out.size])


def test_the_resampler_removes_what_8_khz_cannot_carry():
    out = StreamResampler(24_000, 8_000)(tone(6_000, 24_000, 1.0))  # above the 4 kHz Nyquist limit
    assert out[400:].std() < 1e-4


def test_same_rate_is_passed_through():
    pcm = tone(440, 24_000, 0.1)
    assert np.array_equal(StreamResampler(24_000, 24_000)(pcm), pcm)


def test_vad_finds_a_burst_of_speech_level_audio():
    rate = 24_000
    silence, burst = np.zeros(rate, np.float32), tone(300, rate, 1.0, amplitude=0.1)  # -23 dBFS
    audio = np.concatenate([silence, burst, silence])
    vad = EnergyVAD(rate)
    events = [e for i in range(0, audio.size, 1920) for e in vad.feed(audio[i : i + 1920])]
    assert [e.started for e in events] == [True, False]
    assert events[0].at_ms == 1000  # where the burst begins (the 100 ms it must last are behind it)
    assert events[1].at_ms == 2000  # where the silence begins, told 480 ms later
    assert not EnergyVAD(rate).feed(tone(300, rate, 2.0, amplitude=0.002))  # -57 dBFS: noise, not speech


def test_the_table_builders_follow_the_per_sample_algorithms():
    from pplex_trio.codec import _g711

    samples = np.arange(-32768, 32768, 7, dtype=np.int64)
    assert list(_g711._ulaw_bytes(samples)) == [_g711._ulaw_byte(int(s)) for s in samples]
    assert list(_g711._alaw_bytes(samples)) == [_g711._alaw_byte(int(s)) for s in samples]


def test_pcm16_against_the_struct_module():
    import struct

    from pplex_trio.codec import pcm16_decode, pcm16_encode

    pcm = np.array([0.0, 0.5, -0.5, -1.0, 0.99999, 2.0, -3.0], np.float32)
    expected = struct.pack("<7h", 0, 16384, -16384, -32768, 32767, 32767, -32768)
    assert pcm16_encode(pcm) == expected
    assert pcm16_decode(expected).tolist() == [v / 32768 for v in struct.unpack("<7h", expected)]
