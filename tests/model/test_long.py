"""A call longer than the LM's context: the KV window slides with the reference's rule."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from pplex_trio.model import FREE, LMGen, StepInputs

STEPS = 4000


def _rope(x: torch.Tensor, max_period: float) -> torch.Tensor:
    """Interleaved RoPE as complex rotation, positions 0..T-1 (x: [H, T, D])."""
    h, t, d = x.shape
    freqs = torch.exp(torch.arange(d // 2, dtype=torch.float64) * (-math.log(max_period) * 2 / d))
    angles = torch.arange(t, dtype=torch.float64)[:, None] * freqs
    z = torch.view_as_complex(x.double().reshape(h, t, d // 2, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).reshape(h, t, d).float()


@torch.no_grad()
def _one_shot(lm, x: torch.Tensor, window: int) -> torch.Tensor:
    """The temporal transformer over a whole sequence at once; query p sees keys p-window+1..p."""
    t = x.shape[0]
    pos = torch.arange(t)
    for layer in lm.transformer.layers:
        h = layer.norm1(x[None])[0]
        heads = layer.self_attn.num_heads
        q, k, v = F.linear(h, layer.self_attn.in_proj_weight).view(t, 3, heads, -1).permute(1, 2, 0, 3)
        q, k = _rope(q, lm.cfg.max_period), _rope(k, lm.cfg.max_period)
        out = torch.empty_like(q)
        for s in range(0, t, 500):  # chunks of queries keep the score matrix small
            qp = pos[s : s + 500, None]
            allowed = (pos[None] <= qp) & (pos[None] > qp - window)
            out[:, s : s + 500] = F.scaled_dot_product_attention(q[:, s : s + 500], k, v, allowed)
        x = x + layer.self_attn.out_proj(out.transpose(0, 1).reshape(t, -1))
        x = x + layer.gating(layer.norm2(x[None])[0])
    return lm.out_norm(x[None])[0]


@torch.no_grad()
def test_4000_frames_slide_the_window_past_the_context(tiny_model):
    lm = tiny_model.lm
    context = lm.cfg.context
    assert context == 3000  # the real context: 4000 frames = 320 s, past the 240 s ring
    rng = np.random.RandomState(0)
    forced = np.empty((STEPS, 17), dtype=np.int64)
    forced[:, 0] = rng.randint(0, lm.cfg.text_card, STEPS)
    forced[:, 1:] = rng.randint(0, lm.cfg.card, (STEPS, 16))
    forced[-20:, :9] = FREE  # the last frames are generated: the model still works past the context
    gen = LMGen(lm, 1)
    yes = torch.ones(1, dtype=torch.bool)
    embeddings, hidden, tokens = [], [], []
    for i in range(STEPS):
        r = gen.step(
            StepInputs(tokens=torch.from_numpy(forced[i : i + 1]), exec_mask=yes),
            run_depformer=i >= STEPS - 20,
            return_embeddings=True,
        )
        embeddings.append(r.embeddings[0])
        hidden.append(r.hidden[0])
        tokens.append(r.tokens[0])
    streamed = torch.stack(hidden)
    # The reference's ring attends to context - 1 keys once full.
    reference = _one_shot(lm, torch.stack(embeddings), window=context - 1)
    assert (streamed - reference).abs().max() < 1e-4
    # ...which matters: a plain window of `context` keys differs once the ring is full.
    plain = _one_shot(lm, torch.stack(embeddings[: context + 5]), window=context)
    assert (streamed[: context - 1] - plain[: context - 1]).abs().max() < 1e-4
    assert (streamed[context - 1 : context + 5] - plain[context - 1 :]).abs().max() > 1e-4
    last = torch.stack(tokens[-19:])
    assert ((last[:, 1:9] >= 0) & (last[:, 1:9] < lm.cfg.card)).all()
    assert gen.state.end.item() == STEPS and gen.cache.offset.item() == STEPS + 1
