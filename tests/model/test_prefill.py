"""Chunked prefill against stepwise prompts, on random tiny configs.

A system prompt is teacher-forced: stepping it one LM step at a time (the
reference's way, ``LMGen.step`` with every stream forced) and running it as
chunks of many positions (``LMGen.prefill`` after the token cache is set to
where the plan says the prompt leaves it) must leave the same model: the
same token cache exactly, the same KV ring up to float rounding, and the
same tokens from then on.  Rows that do not prefill stay bit-identical.
The goldens (``test_golden.py``) check the same against NVIDIA's reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pplex_trio.model import LMConfig, LMGen, LMModel, StepInputs, VoicePrompt
from pplex_trio.model._lockstep import CacheRules
from pplex_trio.model._prompt import _with_cache_run

CONTEXT = 16


def _lm(reference: str, seed: int) -> LMModel:
    cfg = LMConfig(
        dim=32,
        num_heads=2,
        num_layers=2,
        context=CONTEXT,
        text_card=40,
        card=32,
        depformer_dim=16,
        depformer_dim_feedforward=32,
        depformer_num_heads=2,
        depformer_num_layers=1,
        reference=reference,
    )
    gen = torch.Generator().manual_seed(seed)
    lm = LMModel(cfg)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            scale = 1.0 if "emb" in name else (0.5 if name.endswith("alpha") else p.shape[-1] ** -0.5)
            p.copy_(torch.randn(p.shape, generator=gen) * scale + (1.0 if name.endswith("alpha") else 0.0))
    return lm.eval()


def _plan(lm: LMModel, steps: int, voice_steps: int, seed: int):
    """A random teacher-forced prompt of ``steps`` positions, the first ``voice_steps`` from a voice."""
    cfg = lm.cfg
    rng = np.random.RandomState(seed)
    tokens = np.concatenate([rng.randint(0, cfg.text_card, (steps, 1)), rng.randint(0, cfg.card, (steps, cfg.n_q))], 1)
    voice = None
    if voice_steps:
        tokens[:voice_steps] = [3] + [cfg.card] * cfg.n_q
        cache = torch.from_numpy(rng.randint(0, cfg.card, (1, cfg.num_streams, cfg.max_delay + 3)))
        voice = VoicePrompt("v.pt", torch.from_numpy(rng.randn(voice_steps, cfg.dim).astype(np.float32)), cache)
    return _with_cache_run(cfg, tokens.astype(np.int64), voice, ())


def _stepwise(gen: LMGen, row: int, plan) -> None:
    b, k = gen.batch_size, gen.lm.cfg.num_streams
    mask = torch.zeros(b, dtype=torch.bool)
    mask[row] = True
    for i in range(plan.num_steps):
        tokens = torch.full((b, k), -1, dtype=torch.long)
        tokens[row] = torch.from_numpy(plan.tokens[i])
        inputs = StepInputs(tokens=tokens, exec_mask=mask)
        if i < plan.voice_steps:
            inputs.embeddings = torch.zeros(b, gen.lm.cfg.dim)
            inputs.embeddings[row] = plan.voice.embeddings[i]
            inputs.embed_mask = mask
            if i == plan.voice_steps - 1:
                inputs.restore_cache = plan.voice.cache
                inputs.restore_mask = mask
        gen.step(inputs, run_depformer=False)


def _chunked(gen: LMGen, rows: dict[int, object], chunk: int, between=None) -> None:
    """The rows' prompts together, ``chunk`` positions per row per call (fewer where the ring wraps)."""
    cursors = {row: 0 for row in rows}
    for row, plan in rows.items():
        gen.set_cache(row, torch.from_numpy(plan.cache_tokens), torch.from_numpy(plan.cache_provided), plan.offset)
    while any(cursors[r] < rows[r].num_steps for r in rows):
        active = [r for r in rows if cursors[r] < rows[r].num_steps]
        starts = [cursors[r] for r in active]
        counts = [gen.prefill_limit(s, min(chunk, rows[r].num_steps - s)) for r, s in zip(active, starts)]
        width = max(counts)
        inputs, voices, masks = [], [], []
        for r, s in zip(active, starts):
            plan = rows[r]
            index = np.minimum(s + np.arange(width), plan.num_steps - 1)
            inputs.append(torch.from_numpy(plan.inputs[index]))
            in_voice = torch.from_numpy(s + np.arange(width) < plan.voice_steps)
            masks.append(in_voice)
            emb = plan.voice.embeddings[np.minimum(index, plan.voice_steps - 1)] if plan.voice_steps else None
            voices.append(emb if emb is not None else torch.zeros(width, gen.lm.cfg.dim))
        untouched = [r for r in range(gen.batch_size) if r not in active]
        before = _rows_state(gen, untouched)
        gen.prefill(active, starts, counts, torch.stack(inputs), torch.stack(voices), torch.stack(masks))
        for name, value in _rows_state(gen, untouched).items():
            assert torch.equal(value, before[name]), f"row state {name} moved while other rows prefilled"
        for r, n in zip(active, counts):
            cursors[r] += n
        if between is not None:
            between()


def _rows_state(gen: LMGen, rows: list[int]) -> dict[str, torch.Tensor]:
    s, c = gen.state, gen.cache
    return {
        "keys": s.keys[:, rows].clone(),
        "values": s.values[:, rows].clone(),
        "end": s.end[rows].clone(),
        "tokens": c.tokens[rows].clone(),
        "provided": c.provided[rows].clone(),
        "offset": c.offset[rows].clone(),
    }


def _live(gen: LMGen, rows: list[int], steps: int, seed: int) -> np.ndarray:
    """``steps`` greedy live steps of ``rows`` on the same random user audio; their output tokens."""
    rng = np.random.RandomState(seed)
    cfg = gen.lm.cfg
    mask = torch.zeros(gen.batch_size, dtype=torch.bool)
    mask[rows] = True
    out = []
    for _ in range(steps):
        tokens = torch.full((gen.batch_size, cfg.num_streams), -1, dtype=torch.long)
        tokens[:, 1 + cfg.num_agent_codebooks :] = torch.from_numpy(rng.randint(0, cfg.card, (1, cfg.n_q // 2)))
        out.append(gen.step(StepInputs(tokens=tokens, exec_mask=mask)).tokens[rows].numpy())
    return np.stack(out)


@pytest.mark.parametrize("reference", ["personaplex", "kyutai"])
@pytest.mark.parametrize(
    "steps,voice_steps",
    [(1, 0), (CONTEXT - 1, 4), (CONTEXT, 0), (CONTEXT + 1, 5), (2 * CONTEXT + 3, 7), (3 * CONTEXT, 0)],
)
def test_chunked_prefill_equals_the_stepwise_prompt(reference, steps, voice_steps):
    lm = _lm(reference, seed=steps)
    plan = _plan(lm, steps, voice_steps, seed=steps + 1)
    stepwise, chunked = LMGen(lm, 2), LMGen(lm, 2)
    _stepwise(stepwise, 0, plan)
    _chunked(chunked, {0: plan}, chunk=6)
    for name in ("tokens", "provided", "offset"):
        assert torch.equal(getattr(chunked.cache, name), getattr(stepwise.cache, name)), name
    assert torch.equal(chunked.state.end, stepwise.state.end) and int(chunked.state.end[0]) == steps
    torch.testing.assert_close(chunked.state.keys, stepwise.state.keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked.state.values, stepwise.state.values, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(_live(chunked, [0], 3 * CONTEXT, seed=5), _live(stepwise, [0], 3 * CONTEXT, seed=5))


@pytest.mark.parametrize("chunk", [1, 2, 5, 100])
def test_rows_at_different_points_prefill_together_beside_a_live_row(chunk):
    """Rows 0 and 2 prefill prompts of different lengths in the same calls while row 1 talks in between."""
    lm = _lm("personaplex", seed=7)
    plans = {0: _plan(lm, 2 * CONTEXT + 1, 6, seed=1), 2: _plan(lm, CONTEXT - 3, 0, seed=2)}
    live_plan = _plan(lm, 5, 0, seed=3)
    chunked, reference, alone = LMGen(lm, 3), LMGen(lm, 3), LMGen(lm, 3)
    for gen in (chunked, reference, alone):
        _stepwise(gen, 1, live_plan)
    seeds: list[int] = []

    def talk() -> None:  # row 1 takes one live step between prefill calls
        seeds.append(len(seeds))
        _live(chunked, [1], 1, seed=seeds[-1])

    _chunked(chunked, plans, chunk, between=talk)
    assert len(seeds) >= (2 if chunk < CONTEXT else 1)
    # The live row is bit-identical to the same talk without any prompt beside it.
    for seed in seeds:
        _live(alone, [1], 1, seed=seed)
    for name, value in _rows_state(chunked, [1]).items():
        assert torch.equal(value, _rows_state(alone, [1])[name]), name
    # The prefilled rows continue exactly as their stepwise prompts would.
    for row, plan in plans.items():
        _stepwise(reference, row, plan)
    np.testing.assert_array_equal(
        _live(chunked, [0, 2], 2 * CONTEXT, seed=9), _live(reference, [0, 2], 2 * CONTEXT, seed=9)
    )


def test_prefill_limit_stops_chunks_at_the_first_wrap():
    lm = _lm("personaplex", seed=1)
    gen = LMGen(lm, 1)
    assert gen.prefill_limit(0, 100) == CONTEXT and gen.prefill_limit(CONTEXT - 4, 100) == 4
    assert gen.prefill_limit(CONTEXT - 1, 100) == 2 and gen.prefill_limit(3 * CONTEXT, 100) == 2
    assert gen.prefill_limit(0, 3) == 3
    kyutai = LMGen(_lm("kyutai", seed=1), 1)
    assert kyutai.prefill_limit(CONTEXT, 100) == 1 and kyutai.prefill_limit(CONTEXT - 1, 100) == 1


def test_the_plan_reads_what_the_stepwise_model_reads(monkeypatch):
    """The plan's input frames are the frames the stepwise run's model reads from its token cache."""
    lm = _lm("personaplex", seed=3)
    plan = _plan(lm, 2 * CONTEXT, 5, seed=4)
    gen = LMGen(lm, 1)
    seen = []
    begin = CacheRules.begin

    def spy(self, cache, tokens, exec_mask):
        frame = begin(self, cache, tokens, exec_mask)
        seen.append(frame.model_input[0].numpy().copy())
        return frame

    monkeypatch.setattr(CacheRules, "begin", spy)
    _stepwise(gen, 0, plan)
    np.testing.assert_array_equal(np.stack(seen), plan.inputs)
