"""The speech-to-text model's pieces that need no oracle: one Mimi encode for both models, the config, the rows.

Token-exactness against Kyutai's reference is ``tests/oracle/test_stt_oracle.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

from pplex_trio.model import (
    TINY_STT,
    LoadedModel,
    LoadedTranscriber,
    Mimi,
    Transcriber,
    ensure_tiny_stt_checkpoint,
    load_state_dict_strict,
    load_transcriber,
    stt_config_from_dict,
)
from pplex_trio.model._tiny import synthetic_voice

FRAMES = 30


@pytest.fixture(scope="module")
def stt() -> LoadedTranscriber:
    return load_transcriber(TINY_STT)


def _pcm(rows: int) -> torch.Tensor:
    """``[rows, FRAMES, 1920]`` of different voice-like signals."""
    return torch.stack(
        [
            torch.from_numpy(synthetic_voice(FRAMES * 0.08, 100.0 + 40 * r, seed=r)).view(FRAMES, 1920)
            for r in range(rows)
        ]
    )


def _encode(mimi: Mimi, pcm: torch.Tensor, num_codebooks: int | None) -> torch.Tensor:
    """Streaming codes ``[rows, FRAMES, n]``; row 1 paused for frames 5-9, row 2 restarted at frame 12."""
    rows = pcm.shape[0]
    state = mimi.init_encoder_state(rows)
    out = []
    for t in range(FRAMES):
        if t == 12:
            state.reset(torch.tensor([r == 2 for r in range(rows)]))
        mask = torch.tensor([not (r == 1 and 5 <= t < 10) for r in range(rows)])
        out.append(mimi.encode_frame(pcm[:, t], state, mask, num_codebooks=num_codebooks))
    return torch.stack(out, dim=1)


def test_one_encode_gives_personaplex_its_own_codes(stt: LoadedTranscriber, golden_model: LoadedModel) -> None:
    # A PersonaPlex-configured Mimi (8 codebooks used) that stores 32: the tiny STT's weights.
    personaplex_mimi = Mimi(dataclasses.replace(stt.config.mimi, num_codebooks=8))
    load_state_dict_strict(personaplex_mimi, stt.mimi.state_dict())
    personaplex_mimi.refresh()
    pcm = _pcm(3)
    for mimi, stored in ((personaplex_mimi, 32), (golden_model.mimi, golden_model.mimi.stored_codebooks)):
        today = _encode(mimi, pcm, None)
        both = _encode(mimi, pcm, stored)
        assert today.shape[-1] == 8 and both.shape[-1] == stored > 8
        assert torch.equal(both[..., :8], today)  # bit for bit: PersonaPlex's codes do not change
        assert len(torch.unique(both[..., 8:])) > 4  # the extra levels are real codes
    # Its levels past 8 take the cheaper distances (one addmm); they still give the codes of the STT's own Mimi,
    # which computes all 32 levels the one way (and matches moshi's: tests/oracle/test_stt_oracle.py).
    assert torch.equal(_encode(personaplex_mimi, pcm, 32), _encode(stt.mimi, pcm, 32))


def test_more_levels_than_stored_are_refused(golden_model: LoadedModel) -> None:
    mimi = golden_model.mimi
    with pytest.raises(ValueError, match=f"stores {mimi.stored_codebooks} codebooks"):
        mimi.encode_frame(torch.zeros(1, 1920), mimi.init_encoder_state(1), num_codebooks=mimi.stored_codebooks + 1)


def test_tiny_stt_is_in_kyutai_layout(stt: LoadedTranscriber) -> None:
    folder = ensure_tiny_stt_checkpoint()
    raw = json.loads((folder / "config.json").read_text())
    assert raw["dep_q"] == 0 and raw["n_q"] == 32 and raw["model_type"] == "stt"
    assert raw["stt_config"] == {"audio_delay_seconds": 0.5, "audio_silence_prefix_seconds": 1.0}
    assert raw["extra_heads_num_heads"] == 4 and raw["extra_heads_dim"] == 6
    assert stt.config.has_end_of_turn and stt.mimi.num_codebooks == 32
    mimi = json.loads((folder / raw["mimi_config_name"]).read_text())
    assert dataclasses.replace(stt_config_from_dict(raw, "x", mimi), name=stt.config.name) == stt.config


def test_a_model_that_speaks_is_not_a_transcriber() -> None:
    with pytest.raises(ValueError, match="dep_q is 8"):
        stt_config_from_dict({"dep_q": 8, "n_q": 16}, "moshi")
    with pytest.raises(ValueError, match="cross_attention"):
        stt_config_from_dict({"dep_q": 0, "cross_attention": True}, "odd")


def _transcribe(stt: LoadedTranscriber, codes: torch.Tensor, plan: dict[int, tuple[list[bool], list[bool]]]):
    """Steps over ``codes`` ``[rows, T, 32]``; ``plan[t] = (reset, exec)`` masks.  Text and probabilities per step."""
    rows, steps, _ = codes.shape
    t = Transcriber(stt.model, rows)
    text, probs = [], []
    for i in range(steps):
        reset, run = plan.get(i, ([False] * rows, [True] * rows))
        t.reset(torch.tensor(reset))
        out = t.step(codes[:, i], torch.tensor(run))
        text.append(out.text)
        probs.append(out.extra_heads)
    return torch.stack(text, 1), torch.stack(probs, 1)


def test_rows_restart_and_pause_without_touching_the_others(stt: LoadedTranscriber) -> None:
    codes = _encode(stt.mimi, _pcm(2), None)  # [2, 30, 32]
    alone_text, alone_probs = _transcribe(stt, codes[:1], {})
    # Row 1 runs other audio, pauses at 3-4, restarts on row 0's audio at step 8: it then equals a fresh row 0.
    mixed = codes.clone()
    mixed[1, 8:] = codes[0, : FRAMES - 8]
    plan = {3: ([False, False], [True, False]), 4: ([False, False], [True, False]), 8: ([False, True], [True, True])}
    text, probs = _transcribe(stt, mixed, plan)
    plain_text, plain_probs = _transcribe(stt, mixed, {})  # the same batch, no pause, no restart
    assert torch.equal(text[0], plain_text[0]) and torch.equal(probs[0], plain_probs[0])  # row 0: bit for bit
    assert torch.equal(text[1, 8:], alone_text[0, : FRAMES - 8])
    np.testing.assert_allclose(probs[1, 8:], alone_probs[0, : FRAMES - 8], atol=1e-6)
    assert (text[1, 3:5] == -2).all()  # paused: no text


def test_the_stream_embeddings_are_one_table(stt: LoadedTranscriber) -> None:
    model = copy.deepcopy(stt.model)
    cfg = model.cfg
    tokens = torch.cat([torch.randint(0, cfg.text_card + 1, (3, 1)), torch.randint(0, cfg.card + 1, (3, cfg.n_q))], 1)
    one_by_one = model.emb[0](tokens[:, 1])
    for k in range(1, cfg.n_q):
        one_by_one = one_by_one + model.emb[k](tokens[:, 1 + k])
    one_by_one = one_by_one + model.text_emb(tokens[:, 0])  # Kyutai's order
    table = model.stacked_embeddings()
    assert model.emb[3].weight.data_ptr() == table[cfg.text_card + 1 + 3 * (cfg.card + 1)].data_ptr()  # no copy
    assert model.stacked_embeddings() is table
    torch.testing.assert_close(model.embed(tokens), one_by_one, rtol=0, atol=1e-5)  # a sum, rounded otherwise
    model.double()  # weights replaced: made again
    assert model.stacked_embeddings() is not table and model.stacked_embeddings().dtype == torch.float64
    torch.testing.assert_close(model.embed(tokens), one_by_one.double(), rtol=0, atol=1e-5)
