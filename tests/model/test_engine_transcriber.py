"""The engine's transcriber on the tiny pair: PersonaPlex unchanged beside it, its rows' lives, its failures."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.engine._transcribing import check_same_mimi
from pplex_trio.model import LoadedTranscriber, Transcriber, load_transcriber

TICKS = 30
JOINS = (0, 7)  # the tick each row goes live


@pytest.fixture(scope="module")
def tiny_stt(_private_cache) -> LoadedTranscriber:
    return load_transcriber("tiny-stt")


def fresh_stt() -> LoadedTranscriber:
    return load_transcriber("tiny-stt")  # (an engine releases its transcriber's own Mimi: one each)


def noise(ticks: int = TICKS, rows: int = 2) -> np.ndarray:
    return (0.1 * np.random.RandomState(3).randn(ticks, rows, 1920)).astype(np.float32)


def run(engine: PersonaPlexEngine, audio: np.ndarray, joins=JOINS) -> dict[str, list]:
    """Start every row, then step them, each LIVE from its join tick on; what came out, per tick."""
    for slot in range(engine.num_slots):
        steps = engine.start(slot, Conversation(persona="Hi.", sampling=Sampling(text_seed=slot, audio_seed=slot)))
        engine.prefill({slot: steps})
    got: dict[str, list] = {"tokens": [], "pcm": [], "text": [], "heard": [], "turn": [], "heard_tokens": []}
    for tick, pcm in enumerate(audio):
        out = engine.step([SlotMode.LIVE if tick >= join else SlotMode.IDLE for join in joins], pcm)
        got["tokens"].append(engine.last_tokens.copy())
        got["pcm"].append(out.pcm)
        got["text"].append(out.text)
        got["heard"].append(out.heard_text)
        got["turn"].append(out.end_of_turn)
        got["heard_tokens"].append(list(engine.last_heard))
    return got


def test_personaplex_is_bit_identical_with_the_transcriber_on(tiny_model):
    audio = noise()
    alone = run(PersonaPlexEngine(tiny_model, 2), audio)
    beside = run(PersonaPlexEngine(tiny_model, 2, transcriber=fresh_stt()), audio)
    np.testing.assert_array_equal(np.stack(alone["tokens"]), np.stack(beside["tokens"]))
    np.testing.assert_array_equal(np.stack(alone["pcm"]), np.stack(beside["pcm"]))
    assert alone["text"] == beside["text"]
    assert all(h is None for h in alone["heard"]) and all(t is None for t in alone["turn"])
    # The transcriber wrote something, only on LIVE rows, with an end-of-turn probability each live tick.
    for tick, (heard, turn) in enumerate(zip(beside["heard"], beside["turn"])):
        for row, join in enumerate(JOINS):
            if tick < join:
                assert heard[row] is None and turn[row] is None
            else:
                assert turn[row] is not None and 0.0 <= turn[row] <= 1.0
    assert sum(piece is not None for heard in beside["heard"] for piece in heard) > 5


def test_a_row_is_transcribed_as_if_alone(tiny_model):
    """The same audio from the same join gives the same words whatever the other row does, and a restarted
    row starts its transcription afresh (the system prompt never reaches the transcriber)."""
    audio = noise()
    together = run(PersonaPlexEngine(tiny_model, 2, transcriber=fresh_stt()), audio)
    other = audio.copy()
    other[:, 0] = noise(rows=1)[:, 0] * 0.5
    engine = PersonaPlexEngine(tiny_model, 2, transcriber=fresh_stt())
    run(engine, other[:10], joins=(0, 0))  # both rows busy with other audio first, then started again
    again = run(engine, audio)
    assert [t[1] for t in together["heard_tokens"]] == [t[1] for t in again["heard_tokens"]]
    assert [t[0] for t in together["heard_tokens"]] == [t[0] for t in again["heard_tokens"]]


def test_a_failed_transcriber_step_costs_only_its_words(tiny_model, monkeypatch, caplog):
    audio = noise(12)
    alone = run(PersonaPlexEngine(tiny_model, 2), audio)
    engine = PersonaPlexEngine(tiny_model, 2, transcriber=fresh_stt())
    real_step = Transcriber.step
    calls = {"n": 0}

    def flaky(self, codes, exec_mask=None):
        calls["n"] += 1
        if calls["n"] in (4, 5):
            raise RuntimeError("a transcriber fault")
        return real_step(self, codes, exec_mask)

    monkeypatch.setattr(Transcriber, "step", flaky)
    failures = []
    original = engine.step

    def step(modes, pcm):
        out = original(modes, pcm)
        failures.append(out.transcriber_failed)
        return out

    engine.step = step  # type: ignore[method-assign]
    got = run(engine, audio)
    assert failures == [False] * 3 + [True] * 2 + [False] * 7
    np.testing.assert_array_equal(np.stack(alone["tokens"]), np.stack(got["tokens"]))  # PersonaPlex unaffected
    assert got["heard"][3] == [None, None] and got["turn"][3] == [None, None]
    assert got["heard_tokens"][3] == [-2, -2] and got["heard_tokens"][6][0] != -2  # words again after
    assert sum("transcriber's step failed" in r.message for r in caplog.records) == 1  # one warning a minute


def test_a_transcriber_on_another_mimi_is_refused(tiny_model, tiny_stt):
    # tiny-stt runs on any Mimi's codes; a real transcriber must have been trained on this very Mimi.
    check_same_mimi(tiny_model, tiny_stt)
    named = dataclasses.replace(tiny_stt, config=dataclasses.replace(tiny_stt.config, name="someone/stt"))
    with pytest.raises(ValueError, match="trained on another Mimi than tiny's"):
        check_same_mimi(tiny_model, named)
    wider = dataclasses.replace(tiny_stt, config=dataclasses.replace(tiny_stt.config, card=2048))
    with pytest.raises(ValueError, match="reads codes of 2048 entries"):
        check_same_mimi(tiny_model, wider)


def test_a_dropped_frame_passes_its_heard_words_on():
    from pplex_trio.engine._outbox import OutputFrame, carry_text

    silence = np.zeros(1920, np.float32)
    dropped = OutputFrame(silence, " hi", 1, heard_text=" hel", end_of_turn=0.7)
    successor = OutputFrame(silence, None, 2, heard_text="lo", end_of_turn=0.2)
    carry_text(dropped, successor)
    assert (successor.text, successor.heard_text, successor.end_of_turn) == (" hi", " hello", 0.7)
