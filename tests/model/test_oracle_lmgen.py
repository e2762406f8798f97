"""The documented relation to Kyutai's ``moshi`` 0.2.13 ``LMGen`` (the installed oracle)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pplex_trio.model import FREE, LMGen, StepInputs, build_lm, convert_kyutai_state_dict, load_state_dict_strict

pytestmark = [pytest.mark.oracle, pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # moshi imports


@torch.no_grad()
def test_user_audio_enters_one_call_later_than_in_kyutai_lmgen():
    loaders = pytest.importorskip("moshi.models.loaders")
    kyutai_lm = pytest.importorskip("moshi.models.lm")
    kw = dict(loaders._lm_kwargs, dim=64, num_heads=4, num_layers=2, context=100, card=64, text_card=128,
              depformer_dim=32, depformer_dim_feedforward=64, depformer_num_heads=2, depformer_num_layers=2, dep_q=8)
    torch.manual_seed(0)
    theirs = loaders.get_moshi_lm(None, lm_kwargs=kw, device="cpu", dtype=torch.float32)
    ours = build_lm(kw, device="meta")
    load_state_dict_strict(ours, convert_kyutai_state_dict(theirs.state_dict()))
    codes = np.random.RandomState(0).randint(0, 64, (40, 8))
    reference = kyutai_lm.LMGen(theirs, use_sampling=False)
    gen = LMGen(ours, 1)
    yes = torch.ones(1, dtype=torch.bool)
    compared = 0
    with reference.streaming(1):
        for i in range(len(codes)):
            expected = reference.step(torch.from_numpy(codes[max(i - 1, 0)]).view(1, 8, 1))
            forced = np.full((1, 17), FREE)
            forced[0, 9:] = codes[i]
            got = gen.step(StepInputs(tokens=torch.from_numpy(forced), exec_mask=yes))
            assert bool(got.valid[0]) == (expected is not None)
            if expected is not None:
                np.testing.assert_array_equal(got.tokens[0, :9].numpy(), expected[0, :, 0].numpy())
                compared += 1
    assert compared == len(codes) - 1
