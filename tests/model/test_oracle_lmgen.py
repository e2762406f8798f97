"""The documented relation to Kyutai's ``moshi`` 0.2.13 ``LMGen`` (the installed oracle)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pplex_trio.model import (
    FREE,
    LMGen,
    LMModel,
    StepInputs,
    convert_kyutai_state_dict,
    lm_config_from_kwargs,
    load_state_dict_strict,
)

pytestmark = [pytest.mark.oracle, pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # moshi imports


@pytest.mark.parametrize("reference,lag", [("personaplex", 1)])
@torch.no_grad()
def test_user_audio_timing_against_kyutai_lmgen(reference, lag):
    """PersonaPlex's rules: the user's audio enters one call later than in Kyutai's ``LMGen``.

    Within the context (no ring effect): our call ``n`` given ``u_n``
    equals Kyutai's call ``n`` given ``u_{n - lag}``.  (Kyutai's rules,
    ``lag`` 0, are checked against moshi over 200 steps in ``tests/oracle``.)
    """
    loaders = pytest.importorskip("moshi.models.loaders")
    kyutai_lm = pytest.importorskip("moshi.models.lm")
    kw = dict(
        loaders._lm_kwargs,
        dim=64,
        num_heads=4,
        num_layers=2,
        context=100,
        card=64,
        text_card=128,
        depformer_dim=32,
        depformer_dim_feedforward=64,
        depformer_num_heads=2,
        depformer_num_layers=2,
        dep_q=8,
    )
    torch.manual_seed(0)
    theirs = loaders.get_moshi_lm(None, lm_kwargs=kw, device="cpu", dtype=torch.float32)
    with torch.device("meta"):
        ours = LMModel(dataclasses.replace(lm_config_from_kwargs(kw), reference=reference))
    load_state_dict_strict(ours, convert_kyutai_state_dict(theirs.state_dict()))
    codes = np.random.RandomState(0).randint(0, 64, (40, 8))
    theirs_gen = kyutai_lm.LMGen(theirs, use_sampling=False)
    gen = LMGen(ours, 1)
    yes = torch.ones(1, dtype=torch.bool)
    compared = 0
    with theirs_gen.streaming(1):
        for i in range(len(codes)):
            expected = theirs_gen.step(torch.from_numpy(codes[max(i - lag, 0)]).view(1, 8, 1))
            forced = np.full((1, 17), FREE)
            forced[0, 9:] = codes[i]
            got = gen.step(StepInputs(tokens=torch.from_numpy(forced), exec_mask=yes))
            assert bool(got.valid[0]) == (expected is not None)
            if expected is not None:
                np.testing.assert_array_equal(got.tokens[0, :9].numpy(), expected[0, :, 0].numpy())
                compared += 1
    assert compared == len(codes) - 1
