"""Per-row streaming state: reset one row, pause one row, the ring attention rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import FREE, LMGen, StepInputs, ring_attention_mask


def _mask(b: int, rows: list[int]) -> torch.Tensor:
    m = torch.zeros(b, dtype=torch.bool)
    m[rows] = True
    return m


@pytest.mark.parametrize("reference,window", [("personaplex", -1), ("kyutai", 0)])
@pytest.mark.parametrize("capacity,num_new", [(5, 1), (6, 2), (64, 1)])
def test_ring_mask_follows_the_reference_rule(capacity, num_new, reference, window):
    """PersonaPlex: a full ring shows ``capacity - 1`` keys; Kyutai: ``capacity`` (each query: not past itself)."""
    window += capacity
    ends = torch.arange(num_new, 4 * capacity, num_new)
    mask = ring_attention_mask(ends, num_new, capacity, reference)
    for b, end in enumerate(ends.tolist()):
        for t in range(num_new):
            query = end - num_new + t
            for slot in range(capacity):
                held = [p for p in range(end) if p % capacity == slot]
                expected = bool(held) and max(0, end - window) <= held[-1] <= query
                assert bool(mask[b, 0, t, slot]) == expected, (end, t, slot)


def test_ring_mask_rejects_an_unknown_reference():
    with pytest.raises(ValueError, match="unknown reference"):
        ring_attention_mask(torch.tensor([3]), 1, 4, "moshi")


@torch.no_grad()
def _mimi_run(mimi, audio: np.ndarray, reset_at: int | None, reset_row: int):
    b = audio.shape[0]
    enc, dec = mimi.init_encoder_state(b), mimi.init_decoder_state(b)
    codes, pcm = [], []
    for i in range(audio.shape[1] // 1920):
        if i == reset_at:
            enc.reset(_mask(b, [reset_row]))
            dec.reset(_mask(b, [reset_row]))
        c = mimi.encode_frame(torch.from_numpy(audio[:, i * 1920 : (i + 1) * 1920]), enc)
        codes.append(c)
        pcm.append(mimi.decode_frame(c, dec))
    return torch.stack(codes, 1).numpy(), torch.cat(pcm, -1).numpy()


def test_mimi_row_reset_leaves_other_rows_bit_identical(golden_model, golden):
    mimi = golden_model.mimi
    audio = np.stack([golden.input_pcm[s : s + 1920 * 70] for s in (0, 1920 * 10, 1920 * 25)])
    codes, pcm = _mimi_run(mimi, audio, None, 1)
    codes_r, pcm_r = _mimi_run(mimi, audio, 30, 1)
    for row in (0, 2):
        np.testing.assert_array_equal(codes_r[row], codes[row])
        np.testing.assert_array_equal(pcm_r[row], pcm[row])
    assert not np.array_equal(codes_r[1, 30:], codes[1, 30:])
    # The reset row is a fresh stream from frame 30 on (its transformer rings wrap within 40 frames).
    fresh_codes, fresh_pcm = _mimi_run(mimi, audio[1:2, 1920 * 30 :], None, 0)
    np.testing.assert_array_equal(codes_r[1, 30:], fresh_codes[0])
    np.testing.assert_allclose(pcm_r[1, 1920 * 30 :], fresh_pcm[0], atol=1e-6, rtol=0)


@torch.no_grad()
def _lm_run(
    lm, user: np.ndarray, reset_at: int | None = None, reset_row: int = 1, paused: range = range(0), paused_row: int = 1
):
    """Greedy LM over forced user codes ``[B, steps, 8]`` (no prompt)."""
    b, steps, _ = user.shape
    gen = LMGen(lm, b)
    tokens, hidden = [], []
    for i in range(steps):
        if i == reset_at:
            gen.reset(_mask(b, [reset_row]))
        forced = np.full((b, 17), FREE)
        forced[:, 9:] = user[:, i]
        exec_mask = torch.ones(b, dtype=torch.bool)
        if i in paused:
            exec_mask[paused_row] = False
        r = gen.step(StepInputs(tokens=torch.from_numpy(forced), exec_mask=exec_mask))
        tokens.append(r.tokens.numpy())
        hidden.append(r.hidden.numpy())
    return np.stack(tokens, 1), np.stack(hidden, 1)


def test_lm_row_reset_leaves_other_rows_bit_identical(golden_model, golden):
    codes = golden.input_codes
    user = np.stack([np.roll(codes, 13 * r, axis=0) for r in range(3)])  # 100 steps: the ring (64) wraps
    tokens, hidden = _lm_run(golden_model.lm, user)
    tokens_r, hidden_r = _lm_run(golden_model.lm, user, reset_at=40)
    for row in (0, 2):
        np.testing.assert_array_equal(tokens_r[row], tokens[row])
        np.testing.assert_array_equal(hidden_r[row], hidden[row])
    fresh_tokens, fresh_hidden = _lm_run(golden_model.lm, user[1:2, 40:])
    np.testing.assert_array_equal(tokens_r[1, 40:], fresh_tokens[0])
    np.testing.assert_allclose(hidden_r[1, 40:], fresh_hidden[0], atol=1e-5, rtol=0)


def test_paused_row_resumes_as_if_nothing_happened(golden_model, golden):
    # A row that does not execute for a while (IDLE) keeps its state: resumed, it continues exactly.
    user = np.stack([golden.input_codes, golden.input_codes[::-1]])
    tokens, hidden = _lm_run(golden_model.lm, user[:, :80])
    paused = range(20, 35)
    user_p = user.copy()
    user_p[1, 35 : 35 + 45] = user[1, 20:65]  # the paused row sees the same frames, later
    tokens_p, hidden_p = _lm_run(golden_model.lm, user_p[:, :80], paused=paused)
    np.testing.assert_array_equal(tokens_p[0], tokens[0])
    np.testing.assert_array_equal(tokens_p[1, :20], tokens[1, :20])
    np.testing.assert_array_equal(tokens_p[1, 35:80], tokens[1, 20:65])
    np.testing.assert_allclose(hidden_p[1, 35:80], hidden[1, 20:65], atol=1e-6, rtol=0)


def _engine_run(model, start_other_at: int | None, ticks: int = 62):
    engine = PersonaPlexEngine(model, 2)
    prefill = engine.start(
        0, Conversation(persona="Hello there.", voice="NATF1.pt", sampling=Sampling(text_seed=3, audio_seed=4))
    )
    rng = np.random.RandomState(0)
    pcm_out, text_out, other_left = [], [], 0
    engine.prefill({0: prefill})
    for tick in range(ticks):
        modes = [SlotMode.LIVE, SlotMode.IDLE]
        pcm = (0.1 * rng.randn(2, 1920)).astype(np.float32)
        if start_other_at is not None and tick == start_other_at:
            other_left = engine.start(1, Conversation(persona="Another one.", voice="NATM0.pt"))
        if start_other_at is not None and tick >= start_other_at:
            if other_left > 0:
                other_left -= engine.prefill({1: 3})[1]
            else:
                modes[1] = SlotMode.LIVE
        out = engine.step(modes, pcm)
        pcm_out.append(out.pcm.copy())
        text_out.append(out.text)
    return np.stack(pcm_out), text_out, prefill


def test_engine_start_leaves_the_other_slot_bit_identical(tiny_model):
    alone, text_alone, prefill = _engine_run(tiny_model, None)
    joined, text_joined, _ = _engine_run(tiny_model, start_other_at=3)
    np.testing.assert_array_equal(joined[:, 0], alone[:, 0])
    assert [t[0] for t in text_joined] == [t[0] for t in text_alone]
    assert np.abs(alone[prefill:, 0]).max() > 1e-3  # the live row really speaks
    assert (alone[:, 1] == 0).all() and all(t[1] is None for t in text_alone)  # IDLE: silence, no text
    assert np.abs(joined[-5:, 1]).max() > 1e-3  # the joining row went live
