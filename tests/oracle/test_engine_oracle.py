"""The engine's Mimi half against moshi: what goes in and what comes out of a tick.

The LM is compared with moshi in ``test_lm_oracle.py``; here the whole
``PersonaPlexEngine.step`` runs (system prompts, a row joining while others
talk, IDLE rows), and moshi's own Mimi checks the audio ends of every LIVE
row: the user codes the engine echoes back (streams 9-16 of its output
frame, one frame late) are moshi's streaming encode of that row's input,
and the audio the engine returns is moshi's streaming decode of the agent
codes the engine chose.  On Kyutai's checkpoint (no system prompt, Kyutai's
rules) the engine's tokens are also checked against unpatched moshi's
``LMGen``, and ``pplex-trio offline`` runs it.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import pytest
import sphn

pytest.importorskip("moshi")

import _moshi_ref as ref  # noqa: E402
import _ours  # noqa: E402
import _tiny_moshi as tiny  # noqa: E402

from pplex_trio._cli import _offline  # noqa: E402
from pplex_trio.engine._interface import Conversation, Sampling, SlotMode  # noqa: E402
from pplex_trio.engine._personaplex import PersonaPlexEngine  # noqa: E402

pytestmark = pytest.mark.oracle

TICKS = 70
JOIN_AT = 25  # row 2 starts while rows 0 and 1 are live
PERSONAS = ("You are a teacher.", "Talk about travel.", "")


def test_engine_audio_ends_equal_moshi_mimi(tiny_checkpoints, speech_rows: np.ndarray) -> None:
    directory = tiny_checkpoints["personaplex-dep16"]
    model = _ours.load(directory)
    engine = PersonaPlexEngine(model, 3)
    card = model.config.lm.card
    remaining = [None, None, None]  # prefill steps left per row; None = not started
    modes_log, tokens_log, pcm_out = [], [], []
    inputs = speech_rows[:3, :TICKS]
    for t in range(TICKS):
        for row in range(3):
            if remaining[row] is None and (row < 2 or t == JOIN_AT):
                remaining[row] = engine.start(row, Conversation(persona=PERSONAS[row], sampling=Sampling(greedy=True)))
        work = {row: 4 for row, left in enumerate(remaining) if left}  # prompts between the ticks, 4 at a time
        for row, done in (engine.prefill(work) if work else {}).items():
            remaining[row] -= done
        modes = [SlotMode.LIVE if left == 0 else SlotMode.IDLE for left in remaining]
        out = engine.step(modes, inputs[:, t])
        for row, mode in enumerate(modes):
            assert mode == SlotMode.LIVE or (not out.pcm[row].any() and out.text[row] is None)
        modes_log.append(modes)
        tokens_log.append(engine.last_tokens.copy())
        pcm_out.append(out.pcm.copy())

    moshi_mimi = tiny.load_moshi_mimi(directory)
    rule = ref.checkpoint_semantics(directory).window
    for row in range(3):
        live = [t for t in range(TICKS) if modes_log[t][row] == SlotMode.LIVE]
        assert len(live) >= 20, f"row {row} was live for {len(live)} ticks only"
        tokens = np.stack([tokens_log[t][row] for t in live])  # [n, 17]
        user_codes = ref.mimi_encode(moshi_mimi, inputs[row : row + 1, live], rule=rule)[0]
        # Output frame j echoes the user codes of live frame j-1 (de-delayed, one frame late).
        np.testing.assert_array_equal(tokens[1:, 9:], user_codes[:-1], f"row {row}: user codes")
        agent = tokens[:, 1:9]
        assert (agent >= 0).all() and (agent < card).all()  # after the prompt every frame is valid
        assert len(np.unique(agent)) > 10
        expected_pcm = ref.mimi_decode(moshi_mimi, agent[None], rule=rule)[0]
        got_pcm = np.stack([pcm_out[t][row] for t in live])
        np.testing.assert_allclose(got_pcm, expected_pcm, rtol=0, atol=1e-5, err_msg=f"row {row}: audio")


KYUTAI_TICKS = 40
KYUTAI_JOIN_AT = 10  # row 1 starts while row 0 talks


def test_engine_runs_a_small_kyutai_checkpoint(tiny_checkpoints, speech_rows: np.ndarray) -> None:
    """A Kyutai checkpoint (64-entry codebooks, no system prompt) speaks exactly as moshi 0.2.13 does.

    Rows go LIVE at once (row 1 joins later).  Each row's first tick is
    silent, as moshi's ``LMGen`` returns nothing then; afterwards its text
    and agent tokens are unpatched moshi's on moshi's streaming codes of
    the row's input, the user codes come back with the frame they were
    given with (Kyutai's timing), and the audio is moshi's streaming decode
    of the agent codes of the frames that exist.
    """
    directory = tiny_checkpoints["kyutai-dep8"]
    model = _ours.load(directory)
    assert model.config.lm.card == 64 and model.config.reference == "kyutai"
    engine = PersonaPlexEngine(model, 2)
    inputs = speech_rows[:2, :KYUTAI_TICKS]
    tokens_log, pcm_log, text_log = [], [], []
    for t in range(KYUTAI_TICKS):
        for row, start in ((0, 0), (1, KYUTAI_JOIN_AT)):
            if t == start:
                assert engine.start(row, Conversation(persona="Ignored.", sampling=Sampling(greedy=True))) == 0
        modes = [SlotMode.LIVE, SlotMode.LIVE if t >= KYUTAI_JOIN_AT else SlotMode.IDLE]
        out = engine.step(modes, inputs[:, t])
        tokens_log.append(engine.last_tokens.copy())
        pcm_log.append(out.pcm.copy())
        text_log.append(list(out.text))
    assert not np.stack(pcm_log)[:KYUTAI_JOIN_AT, 1].any()

    moshi_mimi = tiny.load_moshi_mimi(directory)
    moshi_lm = ref.load_oracle_lm(directory)
    for row, start in ((0, 0), (1, KYUTAI_JOIN_AT)):
        codes = ref.mimi_encode(moshi_mimi, inputs[row : row + 1, start:], rule="kyutai")
        expected = ref.lm_generate(moshi_lm, codes, semantics=ref.KYUTAI)[0]  # [n, 9]; -2 on the first call
        tokens = np.stack(tokens_log[start:])[:, row]
        assert (tokens[0] == -2).all() and (expected[0] == -2).all()
        np.testing.assert_array_equal(tokens[:, :9], expected, f"row {row}: text and agent tokens")
        np.testing.assert_array_equal(tokens[1:, 9:], codes[0, 1:], f"row {row}: user codes")
        pcm = np.stack(pcm_log[start:])[:, row]
        assert not pcm[0].any() and text_log[start][row] is None
        expected_pcm = ref.mimi_decode(moshi_mimi, expected[None, 1:, 1:], rule="kyutai")[0]
        assert np.abs(expected_pcm).max() > 0.05
        np.testing.assert_allclose(pcm[1:], expected_pcm, rtol=0, atol=1e-5, err_msg=f"row {row}: audio")


def test_offline_command_runs_a_kyutai_checkpoint(tiny_checkpoints, speech: np.ndarray, tmp_path: pathlib.Path) -> None:
    """``pplex-trio offline`` on a model without system prompt: the first frame is silent, with empty text."""
    parser = argparse.ArgumentParser()
    _offline.add_arguments(parser)
    sphn.write_wav(str(tmp_path / "in.wav"), speech[: 2 * tiny.SAMPLE_RATE], tiny.SAMPLE_RATE)
    args = parser.parse_args(
        [
            "--model",
            str(tiny_checkpoints["kyutai-dep8"]),
            "--input-wav",
            str(tmp_path / "in.wav"),
            "--output-wav",
            str(tmp_path / "out.wav"),
            "--output-text",
            str(tmp_path / "out.json"),
            "--greedy",
            "--device",
            "cpu",
        ]
    )
    assert _offline.run(args) == 0
    texts = json.loads((tmp_path / "out.json").read_text())
    pcm, rate = sphn.read(str(tmp_path / "out.wav"))
    assert len(texts) == 25 and texts[0] == "" and all(isinstance(t, str) and t for t in texts[1:])
    assert rate == tiny.SAMPLE_RATE and pcm.shape == (1, 2 * tiny.SAMPLE_RATE)
    assert not pcm[0, : tiny.FRAME_SIZE].any() and np.abs(pcm[0, tiny.FRAME_SIZE :]).max() > 0.01
