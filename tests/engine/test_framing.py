"""Reframing any chunking of a PCM stream into whole engine frames."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pplex_trio.engine import InputFramer

FRAME = 8  # small frames keep the property tests fast; the code is size-agnostic
WINDOWS = {"window": 25, "hold_after_underrun": 50}  # 2 s and 4 s of 80 ms ticks (framer_window, framer_hold)


def make_framer(frame_size, max_frames, **options):
    return InputFramer(frame_size, max_frames, **{**WINDOWS, **options})


def stream(n):
    return np.arange(n, dtype=np.float32)


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=30))
@settings(max_examples=200, deadline=None)
def test_any_chunking_yields_the_stream_in_whole_frames(sizes):
    total = sum(sizes)
    data = stream(total)
    framer = make_framer(FRAME, max_frames=1000)
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
    framer = make_framer(FRAME, max_frames=max_frames)
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
        np.testing.assert_array_equal(
            np.concatenate(frames), data[dropped * FRAME : dropped * FRAME + len(frames) * FRAME]
        )


def test_odd_length_chunks_from_a_raw_client():
    framer = make_framer(1920, max_frames=4)
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
    framer = make_framer(FRAME, max_frames=2)
    framer.push(stream(FRAME + 3))
    row = np.full(FRAME, -1.0, dtype=np.float32)
    assert framer.pop_frame_into(row) is not None
    np.testing.assert_array_equal(row, stream(FRAME))
    assert framer.pop_frame_into(row) is None
    np.testing.assert_array_equal(row, stream(FRAME))  # untouched when nothing is complete


def test_one_huge_push_keeps_only_the_newest_frames():
    framer = make_framer(FRAME, max_frames=2)
    dropped = framer.push(stream(FRAME * 10 + 5))
    assert dropped == 8
    np.testing.assert_array_equal(framer.pop_frame(), stream(FRAME * 10)[FRAME * 8 : FRAME * 9])


def simulate(align, phase_ms, ticks=200, page=960, late_pages=(), pause=None, stall=None):
    """Pages of `page` samples every 40 ms at `phase_ms` past each tick; one pop per 80 ms tick.

    The audio is a loud ramp (speech to the framer), silent over the frames of
    ``pause`` (a range of frame numbers, the caller pausing).  Returns the
    latency of each popped frame (tick time - arrival of its last sample, ms),
    the popped audio, and the framer.
    """
    framer = make_framer(1920, max_frames=6, align=align)
    data = np.arange(1, ticks * 1920 + page * 4 + 1, dtype=np.float32)
    if pause is not None:
        data[pause.start * 1920 : pause.stop * 1920] = 0.0
    pages = []  # (arrival ms, samples)
    for k in range(ticks * 2 + 2):
        arrival = phase_ms + 40 * k + (30 if k in late_pages else 0)
        if stall is not None and stall[0] <= k < stall[1]:
            arrival = phase_ms + 40 * stall[1]  # held by the network, then delivered with page stall[1], in order
        pages.append((arrival, data[k * page : (k + 1) * page]))
    pages.sort(key=lambda p: p[0])
    latencies, popped, row, i = [], [], np.zeros(1920, np.float32), 0
    for tick in range(ticks):
        now = 80 * tick
        while i < len(pages) and pages[i][0] <= now:
            framer.push(pages[i][1], pages[i][0])
            i += 1
        arrived = framer.pop_frame_into(row)
        if arrived is not None:
            latencies.append(now - arrived)
            popped.append(row.copy())
    return np.array(latencies), np.concatenate(popped), framer


def test_alignment_cuts_latency_to_the_newest_page():
    for phase in (1, 13, 27, 39, 55, 79):
        naive, naive_audio, _ = simulate(False, phase)
        aligned, aligned_audio, framer = simulate(True, phase)
        steady = aligned[30:]  # after the first alignment window (25 ticks)
        # Naive framing: the frame waits for the tick (up to 80 ms, depending on phase).
        # Aligned: the frame ends at the newest page, so it waits less than one page (40 ms).
        assert steady.max() < 40, (phase, steady.max())
        assert steady.max() <= naive[30:].max()
        assert framer.underruns == 0
        # Continuity: the audio is the stream with at most one contiguous skip.
        jumps = np.flatnonzero(np.diff(aligned_audio) != 1)
        assert len(jumps) <= 1
        assert framer.skipped_samples == (
            aligned_audio[jumps[0] + 1] - aligned_audio[jumps[0]] - 1 if len(jumps) else 0
        )
        assert np.all(np.diff(naive_audio) == 1)  # naive never skips


def test_a_late_page_holds_off_further_skips():
    # Pages land 1 ms before each tick; a few of those come 30 ms late instead.
    late = {240, 250, 260, 300}
    _, _, calm = simulate(True, 79, ticks=400)
    latencies, _, jittery = simulate(True, 79, ticks=400, late_pages=late)
    assert calm.underruns == 0
    # The first late page costs one underrun (a tick of silence); the margin
    # it leaves is then kept for a while, so the later late pages cost nothing.
    assert jittery.underruns == 1
    # Once calm again, phase alignment catches up that one frame (less than a frame at a time), and no more;
    # the caller never paused, so no silence was skipped.
    assert jittery.skipped_samples <= calm.skipped_samples + 1920 and jittery.caught_up_samples == 0
    assert latencies[-20:].max() < 40


def test_a_lag_of_frames_is_caught_up_over_a_pause_never_over_speech():
    """Pages held back 240 ms put an unaligned caller three frames behind: the speech that follows is heard
    whole, three ticks late; the lag goes in the caller's next pause (frames 330 to 345), and no further."""
    latencies, audio, framer = simulate(False, 30, ticks=400, stall=(480, 486), pause=range(330, 345))
    assert framer.skipped_samples == 0  # (naive framing never skips for alignment)
    assert 0 < framer.caught_up_samples <= 15 * 1920
    loud = audio[audio > 0]
    assert np.all(np.diff(loud[loud < 330 * 1920]) == 1) and np.all(np.diff(loud[loud > 345 * 1920]) == 1)
    assert latencies[-20:].max() == latencies[:200].max()  # back to the latency it had before the lag


def test_naive_framing_reports_arrival_of_the_last_sample():
    framer = make_framer(8, max_frames=4)
    framer.push(stream(5), 1.0)
    framer.push(stream(5), 2.0)  # completes the first frame
    framer.push(stream(8), 3.0)
    row = np.zeros(8, np.float32)
    assert framer.pop_frame_into(row) == 2.0
    assert framer.pop_frame_into(row) == 3.0
    assert framer.pop_frame_into(row) is None


def test_a_jittery_client_settles_with_a_margin():
    """A page near the tick is late every 3 s: after a few underruns the framer keeps a margin."""
    late = {k for k in range(100, 1000, 75) if k % 2 == 0}  # 12 late pages
    latencies, _, framer = simulate(True, 79, ticks=500, late_pages=late)
    assert framer.underruns <= 4  # not one per late page
    assert framer.margin > 0
    assert latencies[100:].max() <= 81  # bounded: never more than a frame behind


def test_awaits_page_when_one_more_page_like_the_last_completes_the_frame():
    framer = make_framer(8, max_frames=4, align=True)
    framer.push(stream(4), 1.0)
    assert not framer.awaits_page  # nothing taken yet: the stream has not started its rhythm
    framer.push(stream(4), 2.0)
    framer.pop_frame_into(np.zeros(8, np.float32))
    framer.push(stream(4), 3.0)
    assert framer.awaits_page  # half a frame waits, and pages are half a frame
    framer.push(stream(4), 4.0)
    assert not framer.awaits_page  # whole frame: nothing to wait for
    framer.pop_frame_into(np.zeros(8, np.float32))
    framer.push(stream(2), 5.0)
    assert not framer.awaits_page  # 2 waiting + one more page of 2 is still short
    naive = make_framer(8, max_frames=4)
    naive.push(stream(8), 1.0)
    naive.pop_frame_into(np.zeros(8, np.float32))
    naive.push(stream(4), 2.0)
    assert not naive.awaits_page  # only aligned framing asks the actor to wait


def _frames(values, frame=FRAME):
    """One frame per value: a constant loud frame (value != 0) or digital silence (0)."""
    return [np.full(frame, v, dtype=np.float32) for v in values]


def test_early_audio_is_heard_and_silence_skipped_until_back_to_real_time():
    framer = make_framer(FRAME, max_frames=10)
    for i, pcm in enumerate(_frames([0.5, 0.6, 0, 0, 0, 0.7, 0, 0.8])):  # said before the conversation was live
        assert framer.keep_early(pcm, float(i)) == 0
    assert framer.pending_frames == 0 and framer.catch_up()
    assert framer.pending_frames == 8  # all kept
    heard = []
    for tick in range(8):
        framer.push(np.full(FRAME, 0.1 + tick, np.float32), 100.0 + tick)  # live audio goes on, a frame a tick
        heard.append(float(framer.pop_frame()[0]))
    # Speech is never skipped; the silences are, while behind real time.
    assert heard[:4] == pytest.approx([0.5, 0.6, 0.7, 0.8])
    assert heard[4:] == pytest.approx([0.1, 1.1, 2.1, 3.1])  # then live, in order, nothing lost
    assert framer.caught_up_samples == 4 * FRAME and framer.pending_frames == 4  # still 3 frames behind
    assert framer.stats().behind == 3 * FRAME
    for tick in range(8, 12):  # the caller pauses: the live silence is what gets skipped now
        framer.push(np.zeros(FRAME, np.float32), 100.0 + tick)
        assert float(framer.pop_frame()[0]) == pytest.approx(tick - 3.9)  # the speech before it, in order
    framer.push(np.zeros(FRAME, np.float32), 112.0)
    assert framer.pop_frame()[0] == 0.0 and framer.pending_frames == 0  # the pause skipped: back to real time
    assert framer.caught_up_samples == 8 * FRAME and framer.stats().behind == 0


def test_a_burst_after_a_stall_is_kept_whole_and_caught_up_over_the_pauses():
    """A second of the caller's audio held back by the network, then delivered at once: nothing is lost, and
    the lag is gone after the caller's next pause (the speech right after the stall waits, none is skipped)."""
    framer = make_framer(FRAME, max_frames=50)
    speech, pause = 0.3, 0.0
    script = [speech] * 20 + [speech] * 12 + [speech] * 10 + [pause] * 20 + [speech] * 30  # frames, in order
    stream = np.concatenate(
        [np.full(FRAME, v if v else 0.0, np.float32) + (k if v else 0) * 1e-6 for k, v in enumerate(script)]
    )
    heard, delays = [], []
    for tick in range(len(script) + 20):
        if tick < 20 or tick >= 32:  # frames 20-31 are held by the network for 12 ticks (0.96 s) ...
            if tick == 32:
                framer.push(stream[20 * FRAME : 33 * FRAME], tick)  # ... and arrive at once with the next one
            elif tick < len(script):
                framer.push(stream[tick * FRAME : (tick + 1) * FRAME], tick)
        out = np.zeros(FRAME, np.float32)
        arrived = framer.pop_frame_into(out)
        if arrived is not None:
            heard.append(out.copy())
            delays.append(tick - round(float(np.max(out) - speech) * 1e6) if np.max(out) > 0.1 else None)
    loud = [h for h in heard if np.max(h) > 0.1]
    assert len(loud) == 20 + 12 + 10 + 30  # every speech frame heard, in order
    assert all(np.max(b) > np.max(a) for a, b in zip(loud, loud[1:]))
    assert framer.caught_up_samples == 12 * FRAME  # twelve frames of the pause were not fed to the model
    talk = [d for d in delays if d is not None]
    assert talk[:20] == [0] * 20 and talk[20] == 12  # on time; then the held frames, a tick each, 12 behind ...
    assert talk[-30:] == [0] * 30  # ... and on time again after the pause


@pytest.mark.parametrize("late", [set(), {40, 90, 140, 200, 260, 330}])
def test_a_quiet_caller_at_real_time_loses_no_frame_to_the_tick_s_timing(late):
    """A raw caller at real time whose frames land 5 ms before the tick is due; the tick starts 10 ms early for
    a while (the other conversations' frames were in), then on time for a while, and so on (as beside churning
    clients), and now and then a frame is read just after its tick (``late``).  The frame that waits beside the
    next one when the tick starts later is the caller's timing, not a lag: none of its frames is skipped,
    quiet as they are; they come in order, a tick of silence at most where one was late."""
    framer = InputFramer(1920, max_frames=50, **WINDOWS)
    heard = []
    for k in range(400):
        due = 80.0 * k
        arrival = due - 5 + (10 if k in late else 0)
        start = due - 10 if (k // 60) % 2 == 0 else due  # early for 60 ticks, then on time for 60
        frame = np.full(1920, (k + 1) * 1e-5, np.float32)  # frame n is n * 1e-5: below the speech threshold
        if arrival <= start:
            framer.push(frame, arrival)
        row = np.zeros(1920, np.float32)
        if framer.pop_frame_into(row) is not None:
            heard.append(round(float(row[0]) * 1e5))
        if arrival > start:
            framer.push(frame, arrival)
    assert heard == list(range(1, len(heard) + 1))  # in order, whole
    assert len(heard) >= 399 - len(late) and framer.caught_up_samples == 0


def test_catching_up_holds_phase_alignment_off():
    framer = make_framer(FRAME, max_frames=10, align=True, window=3)
    for pcm in _frames([0.5] * 6):
        framer.keep_early(pcm, 0.0)
    framer.catch_up()
    for tick in range(6):
        framer.push(np.full(FRAME, 0.9, np.float32), 1.0 + tick)
        assert float(framer.pop_frame()[0]) == 0.5  # the early speech, whole, before any skipping
    assert framer.skipped_samples == 0


def test_early_audio_keeps_the_backlog_s_newest_frames_only():
    framer = make_framer(1920, max_frames=50)  # 4 s
    second = np.full(24_000, 0.5, np.float32)
    dropped = sum(framer.keep_early(second, float(t)) for t in range(6))  # six seconds before "live"
    assert dropped == 2 * 13 and framer.early_samples == 4 * 24_000  # the oldest two seconds went (12.5 frames each)
    assert framer.catch_up() and framer.pending_samples == 4 * 24_000 and not framer.catch_up()


def test_a_burst_longer_than_the_backlog_loses_its_oldest_frames_counted():
    framer = make_framer(FRAME, max_frames=10)
    burst = np.arange(1, 13 * FRAME + 1, dtype=np.float32)
    assert framer.push(burst, 1.0) == 2  # 13 frames into room for 10 (and one frame's room for a partial one)
    assert framer.pending_frames == 11 and framer.pop_frame()[0] == burst[2 * FRAME]  # the oldest two went
