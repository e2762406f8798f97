"""Reframing any chunking of a PCM stream into whole engine frames."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pplex_trio.engine import InputFramer

FRAME = 8  # small frames keep the property tests fast; the code is size-agnostic


def stream(n):
    return np.arange(n, dtype=np.float32)


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=30))
@settings(max_examples=200, deadline=None)
def test_any_chunking_yields_the_stream_in_whole_frames(sizes):
    total = sum(sizes)
    data = stream(total)
    framer = InputFramer(FRAME, max_frames=1000)
    out, pos = [], 0
    for size in sizes:
        assert framer.push(data[pos : pos + size]) == 0
        pos += size
        while (frame := framer.pop_frame()) is not None:
            out.append(frame)
    whole = total // FRAME
    assert len(out) == whole
    if out:
        np.testing.assert_array_equal(np.concatenate(out), data[: whole * FRAME])
    assert framer.pending_samples == total - whole * FRAME


@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30), st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_overflow_drops_oldest_whole_frames_and_keeps_alignment(sizes, max_frames):
    """Without reads, what survives is the newest data, cut at the original frame boundaries."""
    total = sum(sizes)
    data = stream(total)
    framer = InputFramer(FRAME, max_frames=max_frames)
    dropped, pos = 0, 0
    for size in sizes:
        dropped += framer.push(data[pos : pos + size])
        pos += size
    kept = framer.pending_samples
    assert kept <= (max_frames + 1) * FRAME
    assert dropped * FRAME + kept == total  # every sample is either kept or counted in a dropped frame
    frames = []
    while (frame := framer.pop_frame()) is not None:
        frames.append(frame)
    for frame in frames:
        assert frame[0] % FRAME == 0  # frames still start on stream frame boundaries
        np.testing.assert_array_equal(frame, np.arange(frame[0], frame[0] + FRAME, dtype=np.float32))
    if frames:
        np.testing.assert_array_equal(np.concatenate(frames), data[dropped * FRAME : dropped * FRAME + len(frames) * FRAME])


def test_odd_length_chunks_from_a_raw_client():
    framer = InputFramer(1920, max_frames=4)
    data = np.random.default_rng(0).standard_normal(1920 * 3 + 7).astype(np.float32)
    for chunk in np.array_split(data, 11):  # uneven, odd sizes
        framer.push(chunk)
    frames = [framer.pop_frame() for _ in range(3)]
    assert framer.pop_frame() is None
    np.testing.assert_array_equal(np.concatenate(frames), data[: 1920 * 3])
    framer.pad_to_frame()
    last = framer.pop_frame()
    np.testing.assert_array_equal(last[:7], data[-7:])
    assert not last[7:].any()


def test_pop_into_fills_the_given_row():
    framer = InputFramer(FRAME, max_frames=2)
    framer.push(stream(FRAME + 3))
    row = np.full(FRAME, -1.0, dtype=np.float32)
    assert framer.pop_frame_into(row)
    np.testing.assert_array_equal(row, stream(FRAME))
    assert not framer.pop_frame_into(row)
    np.testing.assert_array_equal(row, stream(FRAME))  # untouched when nothing is complete


def test_one_huge_push_keeps_only_the_newest_frames():
    framer = InputFramer(FRAME, max_frames=2)
    dropped = framer.push(stream(FRAME * 10 + 5))
    assert dropped == 8
    np.testing.assert_array_equal(framer.pop_frame(), stream(FRAME * 10)[FRAME * 8 : FRAME * 9])
