"""Our libopus writer against sphn's reader, the encoder child, and where encoding runs."""

import numpy as np
import pytest
import sphn

from _helpers.audio import best_lag
from _helpers.ogg import page_sequence, split_pages
from pplex_trio.codec import LibopusWriter, libopus_available, make_writer
from pplex_trio.server._encoders import InlineEncoders, ProcessEncoderPool, make_encoders
from pplex_trio.server._setting_types import OpusEncoderPlacement

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
    reference = np.concatenate(
        [sphn_reader.append_bytes(sphn_writer.append_pcm(pcm[i : i + 1920])) for i in range(0, pcm.size, 1920)]
    )
    ref_lag, ref_corr = best_lag(pcm, reference, 0, 1000)
    assert abs(lag - ref_lag) <= 4  # same codec delay (libopus lookahead)
    assert corr > 0.95 and corr >= ref_corr - 0.02


def test_make_writer_kinds():
    assert isinstance(make_writer("libopus"), LibopusWriter)
    assert isinstance(make_writer("auto"), LibopusWriter)
    assert isinstance(make_writer("sphn"), sphn.OpusStreamWriter)


def test_worker_wire_format_round_trips_in_any_split():
    from pplex_trio.codec._encoder_wire import CLOSE, DATA, Unpacker, pack

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
    pool = ProcessEncoderPool()
    await nursery.start(pool.run)
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(1920 * 5) / 24000)).astype(np.float32)
    frames = [tone[i * 1920 : (i + 1) * 1920] for i in range(5)]
    a, b = pool.open_stream(), pool.open_stream()
    from_child = await pool.encode_many(a, frames)
    other = await pool.encode_many(b, frames[:2])  # a second stream starts its own Ogg stream
    local = LibopusWriter()
    reference = [local.append_pcm(f) for f in frames]

    def decode(messages):
        return np.concatenate([r.append_bytes(m) for r in [sphn.OpusStreamReader(24000)] for m in messages])

    np.testing.assert_allclose(decode(from_child), decode(reference), atol=1e-6)
    assert split_pages(other[0])[0][28:36] == b"OpusHead"
    pool.close_stream(a)
    pool.close_stream(b)


def test_worker_answers_each_frame_in_order():
    """One request of three frames (and a closing) gets three one-item answers, in order."""
    import io

    from pplex_trio.codec._encoder_wire import CLOSE, DATA, READY, Unpacker, pack
    from pplex_trio.codec._worker import serve

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


def test_worker_writes_its_answers_out_at_most_a_millisecond_after_the_first_is_ready():
    """Answers go out in groups: the parent wakes once per group, and no answer waits past FLUSH_AFTER (here each
    encode takes 0.4 ms of a fake clock: groups of 4, 4, then the last 2 when the batch is done).  The grouping
    is the worker's own: its stdout here writes through at once, as ``sys.stdout.buffer`` does under
    PYTHONUNBUFFERED (our container image sets it), so each write is one wake of the parent."""
    import io

    from pplex_trio.codec._encoder_wire import DATA, READY, Unpacker, pack
    from pplex_trio.codec._worker import FLUSH_AFTER, serve

    class WritesThrough(io.RawIOBase):
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        def writable(self) -> bool:
            return True

        def write(self, data) -> int:  # type: ignore[override]
            self.writes.append(bytes(data))
            return len(data)

    ticks = iter(range(100))
    tone = (0.3 * np.sin(np.arange(1920) / 7)).astype("<f4").tobytes()
    stdout = WritesThrough()
    serve(
        io.BufferedReader(io.BytesIO(pack([(i, DATA, tone) for i in range(10)]))),
        stdout,
        clock=lambda: next(ticks) * 0.4 * FLUSH_AFTER,
    )
    assert stdout.writes[0] == READY
    groups = []
    for chunk in stdout.writes[1:]:
        unpacker, group = Unpacker(), []
        unpacker.feed(chunk)
        while (message := unpacker.next_message()) is not None:
            group += [stream for stream, _, _ in message]
        groups.append(group)
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


async def test_the_first_streams_encode_inline_and_the_rest_in_the_child(nursery):
    pool = ProcessEncoderPool(inline_streams=1)
    await nursery.start(pool.run)
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(1920 * 3) / 24000)).astype(np.float32)
    frames = [tone[i * 1920 : (i + 1) * 1920] for i in range(3)]
    inline, child = pool.open_stream(), pool.open_stream()
    assert isinstance(inline, LibopusWriter) and isinstance(child, int)

    def decode(messages):
        return np.concatenate([r.append_bytes(m) for r in [sphn.OpusStreamReader(24000)] for m in messages])

    np.testing.assert_allclose(
        decode(await pool.encode_many(inline, frames)), decode(await pool.encode_many(child, frames)), atol=1e-6
    )
    pool.close_stream(inline)  # its place is free for the next conversation
    assert isinstance(pool.open_stream(), LibopusWriter)
    assert isinstance(pool.open_stream(), int)


async def test_every_placement_encodes_the_same_stream(nursery):
    """process, inline and sphn placements: the same four calls, decodable output in order."""
    tone = (0.3 * np.sin(2 * np.pi * 330 * np.arange(1920 * 4) / 24000)).astype(np.float32)
    frames = [tone[i * 1920 : (i + 1) * 1920] for i in range(4)]
    for placement in (OpusEncoderPlacement.PROCESS, OpusEncoderPlacement.INLINE, OpusEncoderPlacement.SPHN):
        encoders = make_encoders(placement)
        assert isinstance(encoders, ProcessEncoderPool if placement is OpusEncoderPlacement.PROCESS else InlineEncoders)
        await nursery.start(encoders.run)
        stream = encoders.open_stream()
        out = await encoders.encode_many(stream, frames)
        encoders.close_stream(stream)
        pages = [p for m in out for p in split_pages(m)]
        assert [page_sequence(p) for p in pages] == list(range(len(pages)))
        decoded = np.concatenate([r.append_bytes(m) for r in [sphn.OpusStreamReader(24000)] for m in out])
        spectrum = np.abs(np.fft.rfft(decoded[2000:]))
        assert abs(np.argmax(spectrum) * 24000 / (decoded.size - 2000) - 330) < 10, placement


def test_without_libopus_auto_falls_back_loudly(monkeypatch, caplog):
    from pplex_trio.server import _encoders
    from pplex_trio.server._setting_types import OpusEncoderPlacement

    monkeypatch.setattr(_encoders, "libopus_available", lambda: False)
    with caplog.at_level("WARNING"):
        encoders = _encoders.make_encoders(OpusEncoderPlacement.AUTO, 4)
    assert isinstance(encoders, _encoders.InlineEncoders)
    (record,) = [r for r in caplog.records if r.name == "pplex_trio.server._encoders"]
    assert record.levelname == "WARNING" and "CAPACITY WARNING" in record.getMessage()
    assert "48 conversations" in record.getMessage() and "libopus0" in record.getMessage()
