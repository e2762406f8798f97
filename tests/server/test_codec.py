"""Our libopus writer against sphn's reader, and the batching encoder pool."""

import numpy as np
import pytest
import sphn
import trio

from _helpers.audio import best_lag
from pplex_trio.protocol._ogg import page_sequence, split_pages
from pplex_trio.codec._libopus import LibopusWriter, libopus_available
from pplex_trio.codec._pools import EncoderPool, make_writer

pytestmark = pytest.mark.skipif(not libopus_available(), reason="needs the system libopus")


def speech(path, seconds=4.0):
    pcm, _ = sphn.read(str(path))
    return pcm[0, : int(seconds * 24000)]


def test_libopus_stream_decodes_with_sphn_like_sphns_own(speech_wav):
    pcm = speech(speech_wav)
    writer, reader = LibopusWriter(), sphn.OpusStreamReader(24000)
    messages = [writer.append_pcm(pcm[i : i + 1920]) for i in range(0, pcm.size, 1920)]
    pages = [p for m in messages for p in split_pages(m)]
    assert [page_sequence(p) for p in pages] == list(range(len(pages)))
    assert len(pages) == 2 + 2 * len(messages)  # headers, then two 40 ms pages per 80 ms frame
    decoded = np.concatenate([reader.append_bytes(m) for m in messages])
    assert decoded.size == pcm.size
    lag, corr = best_lag(pcm, decoded, 0, 1000)
    # Reference: sphn's own writer on the same audio.
    sphn_writer, sphn_reader = sphn.OpusStreamWriter(24000), sphn.OpusStreamReader(24000)
    reference = np.concatenate([sphn_reader.append_bytes(sphn_writer.append_pcm(pcm[i : i + 1920]))
                                for i in range(0, pcm.size, 1920)])
    ref_lag, ref_corr = best_lag(pcm, reference, 0, 1000)
    assert abs(lag - ref_lag) <= 4  # same codec delay (libopus lookahead)
    assert corr > 0.95 and corr >= ref_corr - 0.02


def test_make_writer_kinds():
    assert isinstance(make_writer("libopus"), LibopusWriter)
    assert isinstance(make_writer("auto"), LibopusWriter)
    assert isinstance(make_writer("sphn"), sphn.OpusStreamWriter)


async def test_pool_encodes_each_sessions_frames_in_order(nursery):
    pool = EncoderPool()
    await nursery.start(pool.run)
    writers = [LibopusWriter() for _ in range(5)]
    readers = [sphn.OpusStreamReader(24000) for _ in writers]
    tones = [np.sin(2 * np.pi * (200 + 100 * k) * np.arange(1920 * 6) / 24000).astype(np.float32) * 0.3
             for k in range(len(writers))]
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

    pool = EncoderPool()
    await nursery.start(pool.run)
    good = LibopusWriter()
    with pytest.raises(RuntimeError, match="exploded"):
        await pool.encode(Broken(), np.zeros(1920, np.float32))
    assert await pool.encode(good, np.zeros(1920, np.float32))
    assert len(await pool.encode_many(good, [np.zeros(1920, np.float32)] * 3)) == 3


def test_worker_wire_format_round_trips_in_any_split():
    from pplex_trio.codec._worker import CLOSE, DATA, Unpacker, pack

    items = [(1, DATA, b"abc"), (2, CLOSE, b""), (3, DATA, bytes(range(256)) * 40)]
    data = pack(items) + pack(items[:1])
    for step in (1, 7, 4096, len(data)):
        unpacker, got = Unpacker(), []
        for i in range(0, len(data), step):
            unpacker.feed(data[i : i + step])
            while (message := unpacker.next_message()) is not None:
                got.append(message)
        assert got == [items, items[:1]]


async def test_encoder_process_matches_an_in_process_writer(nursery):
    """The child's pages decode to what our own LibopusWriter's pages decode to."""
    from pplex_trio.codec._pools import ProcessEncoderPool

    pool = ProcessEncoderPool()
    await nursery.start(pool.run)
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(1920 * 5) / 24000)).astype(np.float32)
    frames = [tone[i * 1920 : (i + 1) * 1920] for i in range(5)]
    a, b = pool.open_stream(), pool.open_stream()
    from_child = await pool.encode_many(a, frames)
    other = await pool.encode_many(b, frames[:2])  # a second stream starts its own Ogg stream
    local = LibopusWriter()
    reference = [local.append_pcm(f) for f in frames]
    decode = lambda messages: np.concatenate([r.append_bytes(m) for r in [sphn.OpusStreamReader(24000)] for m in messages])  # noqa: E731
    np.testing.assert_allclose(decode(from_child), decode(reference), atol=1e-6)
    assert split_pages(other[0])[0][28:36] == b"OpusHead"
    pool.close_stream(a)
    pool.close_stream(b)


def test_worker_answers_each_frame_as_soon_as_it_is_encoded():
    """One request of three frames (and a closing) gets three one-item answers, in order."""
    import io

    from pplex_trio.codec._worker import CLOSE, DATA, READY, Unpacker, pack, serve

    tone = (0.3 * np.sin(np.arange(1920) / 7)).astype("<f4").tobytes()
    request = pack([(1, DATA, tone), (2, DATA, tone), (1, CLOSE, b""), (2, DATA, tone)])
    stdout = io.BytesIO()
    serve(io.BufferedReader(io.BytesIO(request)), stdout)
    out = stdout.getvalue()
    assert out[:1] == READY
    unpacker, answers = Unpacker(), []
    unpacker.feed(out[1:])
    while (message := unpacker.next_message()) is not None:
        answers.append(message)
    assert [[(stream, kind) for stream, kind, _ in a] for a in answers] == [[(1, DATA)], [(2, DATA)], [(2, DATA)]]
    assert all(b"OpusHead" in a[0][2] for a in answers[:2])  # two fresh streams
    assert b"OpusHead" not in answers[2][0][2]  # stream 2 goes on


async def test_the_first_streams_encode_inline_and_the_rest_in_the_child(nursery):
    from pplex_trio.codec._pools import ProcessEncoderPool

    pool = ProcessEncoderPool(inline_streams=1)
    await nursery.start(pool.run)
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(1920 * 3) / 24000)).astype(np.float32)
    frames = [tone[i * 1920 : (i + 1) * 1920] for i in range(3)]
    inline, child = pool.open_stream(), pool.open_stream()
    assert isinstance(inline, LibopusWriter) and isinstance(child, int)
    decode = lambda messages: np.concatenate([r.append_bytes(m) for r in [sphn.OpusStreamReader(24000)] for m in messages])  # noqa: E731
    np.testing.assert_allclose(decode(await pool.encode_many(inline, frames)),
                               decode(await pool.encode_many(child, frames)), atol=1e-6)
    pool.close_stream(inline)  # its place is free for the next conversation
    assert isinstance(pool.open_stream(), LibopusWriter)
    assert isinstance(pool.open_stream(), int)
