"""The engine's Mimi half against moshi: what goes in and what comes out of a tick.

The LM is compared with moshi in ``test_lm_oracle.py``; here the whole
``PersonaPlexEngine.step`` runs (system prompts, a row joining while others
talk, IDLE rows), and moshi's own Mimi checks the audio ends of every LIVE
row: the user codes the engine echoes back (streams 9-16 of its output
frame, one frame late) are moshi's streaming encode of that row's input,
and the audio the engine returns is moshi's streaming decode of the agent
codes the engine chose.
"""

from __future__ import annotations


import numpy as np
import pytest

pytest.importorskip("moshi")

import _moshi_ref as ref  # noqa: E402
import _ours  # noqa: E402
import _tiny_moshi as tiny  # noqa: E402

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
        modes = [
            SlotMode.IDLE if left is None else SlotMode.PREFILL if left > 0 else SlotMode.LIVE for left in remaining
        ]
        out = engine.step(modes, inputs[:, t])
        for row, mode in enumerate(modes):
            if mode == SlotMode.PREFILL:
                remaining[row] -= 1
            else:
                assert mode == SlotMode.LIVE or (not out.pcm[row].any() and out.text[row] is None)
        modes_log.append(modes)
        tokens_log.append(engine.last_tokens.copy())
        pcm_out.append(out.pcm.copy())

    moshi_mimi = tiny.load_moshi_mimi(directory)
    rule = _ours.semantics(model).window
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


@pytest.mark.xfail(
    strict=True,
    raises=IndexError,
    reason="without a `personaplex` object the engine substitutes the real 7B silence codes (948, ...) for "
    "not-yet-valid agent codes, which index past a 64-entry codebook on the first LIVE tick",
)
def test_engine_runs_a_small_kyutai_checkpoint(tiny_checkpoints, speech_rows: np.ndarray) -> None:
    """A Kyutai checkpoint has no system prompt: rows go LIVE at once and must produce audio."""
    engine = PersonaPlexEngine(_ours.load(tiny_checkpoints["kyutai-dep8"]), 2)
    assert [engine.start(row, Conversation(sampling=Sampling(greedy=True))) for row in range(2)] == [0, 0]
    for t in range(5):
        out = engine.step([SlotMode.LIVE] * 2, speech_rows[:2, t])
    assert out.pcm.any()
