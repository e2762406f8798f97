"""bench/stalls.py's arithmetic, without a network: when pages go, where an echoed frame lies in the call, and
the table's row from the answers (its live runs are the benchmark's; the suite's own stall tests are
``tests/engine/test_call_edges.py`` and ``tests/server/sessions/test_edges_on_every_protocol.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import sphn

from bench import stalls

FRAME, PAGE, SR = stalls.FRAME, stalls.PAGE, stalls.SR


def test_the_pages_due_during_a_stall_all_go_at_its_end():
    times = stalls.sent_times(10.0, 200, stall_at=2.0, stall=1.0)
    assert times[:50] == pytest.approx([10.0 + k * 0.04 for k in range(50)])
    assert times[50:75] == pytest.approx([13.0] * 25)  # due from 2.0 s to 3.0 s: held, then at once
    assert times[75] == pytest.approx(13.0) and times[76] == pytest.approx(13.04)


def test_the_call_is_the_callers_turns_with_the_pauses_between():
    pcm = stalls.speech(18.0)
    assert pcm.size == int(18.0 * SR) // FRAME * FRAME
    assert not pcm[: int(0.5 * SR)].any() and pcm[int(0.5 * SR) : int(1.0 * SR)].any()  # a pause, then a turn


def test_an_echoed_frame_is_placed_where_it_lies_even_one_cut_inside_a_pause():
    rng = np.random.default_rng(3)
    pcm = np.concatenate([np.zeros(3 * FRAME, np.float32), rng.uniform(-0.5, 0.5, 5 * FRAME).astype(np.float32)])
    cut = 2 * FRAME + 700  # a frame that begins 700 samples into the pause (after a partial skip of it)
    frames = [(1.0, pcm[3 * FRAME : 4 * FRAME]), (2.0, pcm[cut : cut + FRAME]), (3.0, np.zeros(FRAME, np.float32))]
    answers = stalls.echo_raw([(at, frame.astype("<f4").tobytes()) for at, frame in frames], pcm)
    assert answers == [(1.0, 4 * FRAME), (2.0, cut + FRAME)]  # (silence tells nothing: not placed)


def test_nvidias_outputs_are_the_steps_of_the_last_frames_sent():
    writer = sphn.OpusStreamWriter(SR)
    pages = [writer.append_pcm(np.zeros(FRAME, np.float32)) for _ in range(6)]
    answers = stalls.lockstep([(float(k), page) for k, page in enumerate(pages)], np.zeros(8 * FRAME), 8)
    frames = [end // FRAME for _, end in answers]
    assert frames == list(range(8 - len(frames) + 1, 9))  # the first steps returned nothing
    assert all(a <= b for (a, _), (b, _) in zip(answers, answers[1:]))


def test_a_row_counts_the_speech_not_heard_and_the_lag_left():
    speech = np.concatenate(
        [np.full(10 * FRAME, 0.3, np.float32), np.zeros(30 * FRAME, np.float32), np.full(110 * FRAME, 0.3, np.float32)]
    )
    start, stall_at, stall = 100.0, 2.0, 1.0
    times = stalls.sent_times(start, speech.size // PAGE, stall_at, stall)
    answers = []
    for frame in range(len(speech) // FRAME):
        if frame == 5:
            continue  # one speech frame never heard
        sent = times[2 * frame + 1]
        lag = 0.5 if stall_at + stall <= sent - start < stall_at + stall + 2.0 else 0.0  # behind for 2 s
        answers.append((sent + 0.002 + lag, (frame + 1) * FRAME))
    row = stalls.report("x", speech, times, answers, stall_at, stall)
    assert row["speech_lost"] == 1 and row["speech_frames"] == 120
    assert row["turnaround_before_ms"] == pytest.approx(2.0) and row["turnaround_after_ms"] == pytest.approx(2.0)
    assert 2.0 < row["caught_up_after_s"] <= 2.6  # the last late frame, heard when it was


def test_the_figure_from_outside_follows_each_numbered_frame_from_sending_to_its_echo():
    pcm = np.concatenate([np.full(100 * FRAME, 0.3, np.float32), np.zeros(150 * FRAME, np.float32)])  # 8 s, then 12
    times = stalls.sent_times(50.0, pcm.size // FRAME, 5.0, 1.0, every=FRAME / SR)
    assert times[62] == pytest.approx(50.0 + 4.96) and times[63:75] == pytest.approx([56.0] * 12)
    messages = stalls.numbered_frames(pcm)
    received = []
    for k, message in enumerate(messages):
        if k == 90 or k >= 150 and k % 2:
            continue  # a speech frame never heard; half the silence skipped
        late = 0.158 if k >= 150 else 0.085  # a tick more from 12 s on
        received.append((times[k] + late, message))
    row = stalls.numbered_row(pcm, times, received, 5.0, 1.0)
    assert row["speech_frames"] == 100 and row["speech_lost"] == 1
    assert row["turnaround_before_ms"] == pytest.approx(85.0) and row["turnaround_after_ms"] == pytest.approx(158.0)
    assert row["turnaround_after_max_ms"] == pytest.approx(158.0)
