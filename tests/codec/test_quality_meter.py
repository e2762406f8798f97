"""The conversation-quality meter on constructed audio: tones where a side speaks, faint noise where it does not.

Every expected figure is worked out here by frame arithmetic from the construction, not by the meter's code.
"""

from __future__ import annotations

import numpy as np
import pytest

from pplex_trio.codec import BARGE_IN_FRAMES, BargeIn, ConversationQuality, Response, TurnResponse

FRAME = 1920
RATE = 24_000
F = 0.08  # seconds a frame
_rng = np.random.default_rng(7)


def _tone(samples: int, start: int = 0) -> np.ndarray:
    t = (np.arange(samples) + start) / RATE
    return (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)  # -23 dB FS: speech


def _noise(samples: int) -> np.ndarray:
    return (0.0005 * _rng.standard_normal(samples)).astype(np.float32)  # -66 dB FS: a quiet line


def _audio(frames: int, spans: list[tuple[int, int]]) -> np.ndarray:
    """``frames`` frames, a tone over each ``[start, stop)`` span of frames, faint noise elsewhere."""
    pcm = _noise(frames * FRAME)
    for start, stop in spans:
        pcm[start * FRAME : stop * FRAME] = _tone((stop - start) * FRAME, start * FRAME)
    return pcm


def _run(caller: np.ndarray, agent: np.ndarray) -> tuple[ConversationQuality, list[object]]:
    meter, events = ConversationQuality(), []
    for k in range(len(caller) // FRAME):
        events += meter.feed(caller[k * FRAME : (k + 1) * FRAME], agent[k * FRAME : (k + 1) * FRAME])
    events += meter.finish()
    return meter, events


def test_a_response_after_the_caller_ends() -> None:
    # The caller speaks frames 0-24 (0-2 s), the agent 30-49 (2.4-4 s); 60 frames in all.
    meter, events = _run(_audio(60, [(0, 25)]), _audio(60, [(30, 50)]))
    stats = meter.statistics()
    assert stats.frames == 60
    assert stats.response_latencies == pytest.approx([(30 - 25) * F])  # 400 ms
    assert events == [Response(pytest.approx(0.4))]
    assert stats.dead_air_s == pytest.approx((30 - 25) * F)  # the wait for the answer
    assert stats.talk_over_s == 0
    assert stats.agent_share == pytest.approx(20 / 60)
    assert stats.barge_ins == 0
    assert stats.as_dict() == {
        "response_latency_ms": {"last": 400, "median": 400, "count": 1},
        "talk_over_s": 0.0,
        "dead_air_s": 0.4,
        "agent_share": 0.333,
        "barge_ins": 0,
    }


def test_the_brief_s_example_in_seconds_within_a_frame() -> None:
    # Not frame-aligned: the caller 0-2 s, the agent from 2.4 s to 4.5 s; latency 400 ms within a frame.
    caller = _noise(6 * RATE)
    caller[: 2 * RATE] = _tone(2 * RATE)
    agent = _noise(6 * RATE)
    agent[int(2.4 * RATE) : int(4.5 * RATE)] = _tone(int(2.1 * RATE))
    (latency,) = _run(caller, agent)[0].statistics().response_latencies
    assert abs(latency - 0.4) <= F


def test_talk_over_of_one_second() -> None:
    # The caller 0-24, the agent 13-37: both speak in 13-24 (12 frames).
    caller, agent = _audio(50, [(0, 25)]), _audio(50, [(13, 38)])
    stats = _run(caller, agent)[0].statistics()
    assert stats.talk_over_s == pytest.approx(12 * F)
    assert stats.response_latencies == ()  # the agent was speaking as the caller ended: no response to time
    assert stats.dead_air_s == 0
    # In seconds: the caller 0-2 s, the agent 1-3 s: one second of talk-over, within a frame at each edge.
    caller, agent = _noise(4 * RATE), _noise(4 * RATE)
    caller[: 2 * RATE] = _tone(2 * RATE)
    agent[RATE : 3 * RATE] = _tone(2 * RATE)
    assert abs(_run(caller, agent)[0].statistics().talk_over_s - 1.0) <= 2 * F


def test_dead_air_of_a_three_second_gap_and_an_answer_too_late() -> None:
    # The caller 0-24, then 38 frames (3.04 s) of silence, then the caller again (63-79); the agent never.
    stats = _run(_audio(90, [(0, 25), (63, 80)]), _audio(90, []))[0].statistics()
    assert stats.dead_air_s == pytest.approx((38 + (90 - 80)) * F)  # the gap, and the end after the last words
    assert stats.response_latencies == ()
    assert stats.agent_share == 0
    # An agent that starts more than 10 s (125 frames) after the caller ended is not answering it.
    stats = _run(_audio(200, [(0, 25)]), _audio(200, [(25 + 126, 170)]))[0].statistics()
    assert stats.response_latencies == ()
    assert stats.dead_air_s == pytest.approx(126 * F)


def test_a_short_pause_is_inside_speech_and_a_blip_is_not_speech() -> None:
    # The caller 0-9, a pause of 5 frames (< the 6-frame hangover), 15-24; a one-frame blip at 55 from the agent
    # (< 2 frames of speech), its answer at 30-44.
    stats = _run(_audio(60, [(0, 10), (15, 25)]), _audio(60, [(30, 45), (55, 56)]))[0].statistics()
    assert stats.response_latencies == pytest.approx([(30 - 25) * F])  # from the end of the whole turn
    assert stats.dead_air_s == pytest.approx(5 * F)  # the pause inside the turn is not dead air
    assert stats.agent_share == pytest.approx(15 / 60)  # the blip is not speech


def test_a_barge_in_and_an_agent_that_talks_on() -> None:
    # The agent speaks from 0; the caller starts at 20 and speaks to 40; the agent stops 3 frames after: a barge-in.
    meter, events = _run(_audio(60, [(20, 40)]), _audio(60, [(0, 23)]))
    stats = meter.statistics()
    assert stats.barge_ins == 1 and events == [BargeIn()]
    assert stats.talk_over_s == pytest.approx(3 * F)
    # ... it stops at the limit (6 frames after): still one; one frame later: none.
    assert _run(_audio(60, [(20, 40)]), _audio(60, [(0, 20 + BARGE_IN_FRAMES)]))[0].statistics().barge_ins == 1
    assert _run(_audio(60, [(20, 40)]), _audio(60, [(0, 21 + BARGE_IN_FRAMES)]))[0].statistics().barge_ins == 0
    # The agent talks on over the caller: no barge-in, and talk-over all along.
    stats = _run(_audio(60, [(20, 40)]), _audio(60, [(0, 50)]))[0].statistics()
    assert stats.barge_ins == 0
    assert stats.talk_over_s == pytest.approx(20 * F)


def test_figures_lag_by_the_hangover_at_most_and_silence_as_none() -> None:
    meter = ConversationQuality()
    tone, quiet = _tone(FRAME), np.zeros(FRAME, np.float32)
    for _ in range(10):
        meter.feed(tone, quiet)
    for k in range(10):
        meter.feed(None, quiet)  # a tick with no input frame: silence
        assert meter.statistics().frames >= 10 + k + 1 - 6
    assert meter.feed(None, tone) == ()  # the agent's first loud frame: not decided yet
    assert meter.feed(None, tone) == (Response(pytest.approx(10 * F)),)
    assert meter.statistics().dead_air_s == pytest.approx(10 * F)


def _run_with_turn(caller: np.ndarray, agent: np.ndarray, turn: tuple[float, float], told_at: int):
    """As :func:`_run`, the model's end of turn ``(start, end)`` told once ``told_at`` frames were fed."""
    meter, events = ConversationQuality(), []
    for k in range(len(caller) // FRAME):
        if k == told_at:
            events += meter.turn_ended(*turn)
        events += meter.feed(caller[k * FRAME : (k + 1) * FRAME], agent[k * FRAME : (k + 1) * FRAME])
    events += meter.finish()
    return meter, events


@pytest.mark.parametrize("told_at", [27, 33, 45])  # before the answer, just after it, well after (the delay)
def test_the_turn_figures_from_the_models_end_of_turn_beside_the_vads(told_at) -> None:
    # The caller 0-24; the model ends the turn at 2.16 s (frame 27), 160 ms after the VAD's first silent frame; the
    # agent 20-22 (a back-channel inside the turn: talk-over) and 30-49, answering 240 ms after the model's end.
    meter, events = _run_with_turn(_audio(60, [(0, 25)]), _audio(60, [(20, 23), (30, 50)]), (0.08, 2.16), told_at)
    stats = meter.statistics()
    assert stats.turns == 1 and stats.turn_response_latencies == pytest.approx([0.24])
    assert TurnResponse(pytest.approx(0.24)) in events
    assert stats.turn_talk_over_s == pytest.approx(3 * F)  # frames 20-22, within the turn (1-26)
    figures = stats.as_dict()
    assert figures["response_latency_turn_ms"] == {"last": 240, "median": 240, "count": 1}
    assert figures["talk_over_turn_s"] == 0.24


def test_no_turn_figures_without_turns_and_none_when_the_agent_talks_on() -> None:
    assert "talk_over_turn_s" not in _run(_audio(30, [(0, 25)]), _audio(30, []))[0].statistics().as_dict()
    # The agent speaks through the turn's end: nothing answers it.
    meter, events = _run_with_turn(_audio(60, [(0, 25)]), _audio(60, [(20, 50)]), (0.08, 2.16), 40)
    assert meter.statistics().turn_response_latencies == () and not any(isinstance(e, TurnResponse) for e in events)


def _run_with_gap(caller: np.ndarray, agent: np.ndarray, gap_at: int, turn: tuple[float, float] | None = None):
    """As :func:`_run`, the conversation paused (an outage) once ``gap_at`` frames were fed; with ``turn``, the
    model's end of turn told at the end of the frames."""
    meter, events = ConversationQuality(), []
    for k in range(len(caller) // FRAME):
        if k == gap_at:
            meter.gap()
        events += meter.feed(caller[k * FRAME : (k + 1) * FRAME], agent[k * FRAME : (k + 1) * FRAME])
    if turn is not None:
        events += meter.turn_ended(*turn)
    events += meter.finish()
    return meter, events


def test_a_response_across_an_outage_is_not_measured_and_the_outage_is_no_dead_air() -> None:
    # The caller 0-24, an outage after frame 27 (frames 25-27 silent before it), the agent answers at frame 30.
    caller, agent = _audio(60, [(0, 25)]), _audio(60, [(30, 50)])
    meter, events = _run_with_gap(caller, agent, gap_at=28, turn=(0.08, 2.16))
    stats = meter.statistics()
    assert stats.response_latencies == () and not any(isinstance(e, Response) for e in events)
    assert stats.turns == 1 and stats.turn_response_latencies == ()  # the model's end of turn (frame 27) too
    assert stats.dead_air_s == pytest.approx((30 - 25) * F)  # the frames fed: the outage has none
    # Without the outage's mark the same frames give a response (the test's control).
    assert _run(caller, agent)[0].statistics().response_latencies == pytest.approx([(30 - 25) * F])


def test_a_response_after_an_outage_is_measured_from_the_callers_end_after_it() -> None:
    # An outage after frame 10 (in the caller's speech, 0-24); the agent answers at 30: measured as ever.
    meter, events = _run_with_gap(_audio(60, [(0, 25)]), _audio(60, [(30, 50)]), gap_at=10)
    assert meter.statistics().response_latencies == pytest.approx([(30 - 25) * F])
    assert events == [Response(pytest.approx(0.4))]
