"""The worker-thread encoder placement that bench/ keeps for comparisons."""

import pathlib
import sys

import numpy as np
import pytest
import sphn
import trio

from pplex_trio.codec import LibopusWriter, libopus_available

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from _thread_encoders import ThreadEncoders  # noqa: E402

pytestmark = pytest.mark.skipif(not libopus_available(), reason="needs the system libopus")


async def test_pool_encodes_each_sessions_frames_in_order(nursery):
    pool = ThreadEncoders()
    await nursery.start(pool.run)
    writers = [LibopusWriter() for _ in range(5)]
    readers = [sphn.OpusStreamReader(24000) for _ in writers]
    tones = [
        np.sin(2 * np.pi * (200 + 100 * k) * np.arange(1920 * 6) / 24000).astype(np.float32) * 0.3
        for k in range(len(writers))
    ]
    results = {k: [] for k in range(len(writers))}

    async def session(k):
        for i in range(6):
            results[k].append(await pool.encode(writers[k], tones[k][i * 1920 : (i + 1) * 1920]))

    async with trio.open_nursery() as sessions:
        for k in range(len(writers)):
            sessions.start_soon(session, k)
    assert pool.frames == 30 and pool.batches < 30  # frames of concurrent sessions share thread calls
    for k in range(len(writers)):
        out = np.concatenate([readers[k].append_bytes(m) for m in results[k]])
        spectrum = np.abs(np.fft.rfft(out[4000:]))
        peak_hz = np.argmax(spectrum) * 24000 / (out.size - 4000)
        assert abs(peak_hz - (200 + 100 * k)) < 10


async def test_pool_error_reaches_only_its_session(nursery):
    class Broken:
        def append_pcm(self, pcm):
            raise RuntimeError("encoder exploded")

    pool = ThreadEncoders()
    await nursery.start(pool.run)
    good = LibopusWriter()
    with pytest.raises(RuntimeError, match="exploded"):
        await pool.encode(Broken(), np.zeros(1920, np.float32))
    assert await pool.encode(good, np.zeros(1920, np.float32))
    assert len(await pool.encode_many(good, [np.zeros(1920, np.float32)] * 3)) == 3
