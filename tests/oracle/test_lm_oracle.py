"""Our LM (``LMModel`` + ``LMGen``) against moshi 0.2.13's ``LMGen``, greedy, same tiny weights.

Text and agent-audio tokens must be exactly equal.  The user audio is real
speech encoded by Mimi; every run is several times longer than the tiny
contexts (24 and 32 frames), so the KV rings wrap.  moshi runs with the
semantics of the checkpoint's reference (:func:`_moshi_ref.checkpoint_semantics`):
moshi 0.2.13 unpatched for Kyutai's checkpoint, NVIDIA's fork's rules
patched in for the PersonaPlex-style one.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

pytest.importorskip("moshi")

import _moshi_ref as ref  # noqa: E402
import _ours  # noqa: E402
from _tiny_moshi import BATCH, LM_STEPS  # noqa: E402

pytestmark = pytest.mark.oracle

BATCH_STEPS = 80  # > 2 contexts: the rings wrap before and after the reset
RESET_AT, RESET_ROW = 40, 2
PAUSE_ROW, PAUSED = 3, range(20, 25)
RESETS = {RESET_AT: [RESET_ROW]}
PAUSES = {t: [r != PAUSE_ROW for r in range(BATCH)] for t in PAUSED}


@pytest.fixture(scope="module")
def ours(checkpoint: pathlib.Path):
    return _ours.load(checkpoint)


@pytest.fixture(scope="module")
def moshi_lm(checkpoint: pathlib.Path):
    return ref.load_oracle_lm(checkpoint)


def test_loader_picks_the_checkpoints_reference(ours, checkpoint: pathlib.Path) -> None:
    """Kyutai's checkpoint runs Kyutai's rules, the PersonaPlex-style one NVIDIA's (from config.json alone)."""
    expected = ref.checkpoint_semantics(checkpoint)
    assert _ours.semantics(ours) == expected
    assert ours.config.reference == ("kyutai" if expected == ref.KYUTAI else "personaplex")
    assert ours.config.prompt.enabled == (ours.config.reference == "personaplex")


def test_kyutai_checkpoint_is_compared_with_unpatched_moshi(tiny_checkpoints) -> None:
    """For Kyutai's checkpoint the oracle is moshi 0.2.13 as published: no rule of it is patched."""
    from moshi.modules import transformer as tr

    assert ref.checkpoint_semantics(tiny_checkpoints["kyutai-dep8"]) == ref.KYUTAI
    original = tr.RingKVCache.complete
    with ref.attention_window(ref.KYUTAI.window, ref.KYUTAI.depformer_window):
        assert tr.RingKVCache.complete is original
    assert ref.KYUTAI.user_lag == 0


def test_greedy_tokens_equal_moshi(ours, moshi_lm, checkpoint: pathlib.Path, user_codes) -> None:
    codes = user_codes[checkpoint.name][:1, :LM_STEPS]
    assert LM_STEPS > 5 * ours.config.lm.context
    got = _ours.lm_generate(ours, codes)
    expected = ref.lm_generate(moshi_lm, codes, semantics=ref.checkpoint_semantics(checkpoint))
    assert (expected[0, 0] == -2).all() and (expected[0, 1:] >= 0).all()
    first_bad = np.flatnonzero((got != expected).any(-1)[0])
    assert first_bad.size == 0, (
        f"first differing step {first_bad[0]}: ours {got[0, first_bad[0]]}, moshi {expected[0, first_bad[0]]}"
    )


def test_batch_reset_and_pause(ours, moshi_lm, checkpoint: pathlib.Path, user_codes) -> None:
    """B=4: batched equals four B=1 runs; a reset or paused row disturbs nobody; moshi agrees.

    * plain B=4 run, row by row == B=1 runs (tokens);
    * with row 2 reset at step 40 and row 3 paused (exec mask off) at 20-24,
      the other rows are bit-identical to the plain run (tokens and the
      temporal transformer's output), row 2 from step 40 equals a fresh B=1
      stream, row 3 equals a B=1 stream that never saw the paused frames;
    * moshi's ``reset_streaming(mask)`` / ``set_exec_mask`` (with
      ``support_out_of_sync=True``) give the same tokens on every step that ran.
    """
    codes = user_codes[checkpoint.name][:, :BATCH_STEPS]
    plain_hidden: list[np.ndarray] = []
    event_hidden: list[np.ndarray] = []
    plain = _ours.lm_generate(ours, codes, hidden=plain_hidden)
    events = _ours.lm_generate(ours, codes, RESETS, PAUSES, hidden=event_hidden)
    h_plain, h_events = np.stack(plain_hidden, 1), np.stack(event_hidden, 1)

    for row in range(BATCH):
        np.testing.assert_array_equal(plain[row], _ours.lm_generate(ours, codes[row : row + 1])[0], f"row {row}")

    for row, upto in ((0, BATCH_STEPS), (1, BATCH_STEPS), (RESET_ROW, RESET_AT), (PAUSE_ROW, min(PAUSED))):
        np.testing.assert_array_equal(events[row, :upto], plain[row, :upto], f"row {row} moved")
        assert np.array_equal(h_events[row, :upto], h_plain[row, :upto]), f"row {row}: hidden state not bit-identical"

    fresh = _ours.lm_generate(ours, codes[RESET_ROW : RESET_ROW + 1, RESET_AT:])[0]
    np.testing.assert_array_equal(events[RESET_ROW, RESET_AT:], fresh)
    ran = np.ones(BATCH_STEPS, dtype=bool)
    ran[list(PAUSED)] = False
    resumed = _ours.lm_generate(ours, codes[PAUSE_ROW : PAUSE_ROW + 1, ran])[0]
    np.testing.assert_array_equal(events[PAUSE_ROW, ran], resumed)

    expected = ref.lm_generate(moshi_lm, codes, RESETS, PAUSES, semantics=ref.checkpoint_semantics(checkpoint))
    for row in range(BATCH):
        steps = ran if row == PAUSE_ROW else slice(None)
        np.testing.assert_array_equal(events[row, steps], expected[row, steps], f"row {row} differs from moshi")


def flips(semantics: ref.Semantics) -> list[ref.Semantics]:
    """``semantics`` with one part changed: the window, the user lag, or the depformer's window."""
    other = {"fork": "kyutai", "kyutai": "fork"}
    return [
        dataclasses.replace(semantics, window=other[semantics.window]),
        dataclasses.replace(semantics, user_lag=1 - semantics.user_lag),
        dataclasses.replace(semantics, depformer_window=other[semantics.depformer_window]),
    ]


@pytest.mark.parametrize("part", ["window", "user_lag", "depformer_window"])
def test_each_part_of_the_reference_matters(ours, moshi_lm, checkpoint: pathlib.Path, user_codes, part: str) -> None:
    """Changing any one part of the checkpoint's semantics on the moshi side breaks parity.

    So the oracle's imitation of each reference has nothing superfluous,
    and each part is a real, separate behaviour: the ring window and the
    user timing (the two rules ``ModelConfig.reference`` switches), and a
    depformer whose last step sees step 0 (moshi's, unlike the fork's ring,
    which would hide it from agent codebook 7 of a dep_q 8 model).
    """
    codes = user_codes[checkpoint.name][:1, :40]  # past the 24/32-frame contexts: the rings wrap
    semantics = ref.checkpoint_semantics(checkpoint)
    changed = flips(semantics)[["window", "user_lag", "depformer_window"].index(part)]
    assert getattr(changed, part) != getattr(semantics, part)
    expected = ref.lm_generate(moshi_lm, codes, semantics=changed)
    assert not np.array_equal(_ours.lm_generate(ours, codes), expected)
