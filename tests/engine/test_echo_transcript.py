"""The echo engine's scripted transcript: the caller's words on the frames, through the actor, on virtual time."""

import numpy as np
import pytest

from _helpers.engine_calls import inline_runner, run_engine_calls
from pplex_trio.engine import Conversation, EchoEngine, EngineActor, LeaseState, SlotMode
from pplex_trio.engine._echo import scripted_transcript

SILENCE = np.zeros((2, 1920), np.float32)


def test_a_scripted_transcript_is_heard_on_each_row_from_its_own_start():
    engine = EchoEngine(2, transcript=scripted_transcript({1: " hel", 2: "lo"}, turn_ends={4}), transcript_delay=0.3)
    assert engine.transcript_delay == 0.3 and EchoEngine(1).transcript_delay is None
    outs = [engine.step([SlotMode.LIVE, SlotMode.LIVE if t >= 2 else SlotMode.IDLE], SILENCE) for t in range(6)]
    assert [o.heard_text for o in outs] == [
        [None, None],
        [" hel", None],
        ["lo", None],  # row 1's frame 0
        [None, " hel"],
        [None, "lo"],
        [None, None],
    ]
    assert [o.end_of_turn for o in outs][4] == [0.9, 0.01] and outs[0].end_of_turn == [0.01, None]
    assert EchoEngine(1).step([SlotMode.LIVE], SILENCE[:1]).heard_text is None  # no transcriber: nothing


def test_the_transcript_may_hear_the_audio():
    loud = EchoEngine(1, transcript=lambda n, pcm: (" loud" if pcm.max() > 0.5 else None, None))
    assert loud.step([SlotMode.LIVE], np.ones((1, 1920), np.float32)).heard_text == [" loud"]
    assert loud.step([SlotMode.LIVE], SILENCE[:1]).heard_text == [None]


async def test_heard_words_reach_the_lease_and_a_failure_costs_only_its_frame(nursery, autojump_clock, monkeypatch):
    def transcript(frame: int, pcm: np.ndarray) -> tuple[str | None, float | None]:
        if frame == 2:
            raise RuntimeError("a transcriber fault")
        return f" w{frame}", frame / 10

    engine = EchoEngine(1, prefill_steps=0, transcript=transcript)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        while lease.state is not LeaseState.READY:
            await lease.wait_changed()
        frames = []
        for _ in range(4):
            lease.push_input(np.full(1920, 0.1, np.float32), 0.0)
            (frame,) = await lease.frames().__anext__()
            frames.append(frame)
    assert [(f.text, f.heard_text, f.end_of_turn) for f in frames] == [
        (" 0", " w0", 0.0),
        (" 1", " w1", pytest.approx(0.1)),
        (" 2", None, None),  # the words of that frame are lost, the conversation goes on
        (" 3", " w3", pytest.approx(0.3)),
    ]
    assert actor.metrics.transcriber_failures._value.get() == 1
