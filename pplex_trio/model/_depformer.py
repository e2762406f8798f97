"""The depformer: a small transformer over the codebooks of one frame.

For each frame the temporal transformer produces one vector; the depformer
then predicts the frame's audio codebooks one after the other, step ``s``
seeing the token chosen at step ``s - 1`` (the text token for step 0).
Each step has its own weights (``weights_per_step``): attention projections
are stored stacked (``in_proj_weight`` is ``[steps * 3 * dim, dim]``) and
FFNs as ``gating.{s}``.  There is no positional embedding; keys live for
one frame only.

PersonaPlex has 16 steps but steps 8-15 predict the *user's* codebooks,
which are always replaced by the real user tokens: we run only the agent
steps unless asked otherwise (outputs are identical, see the tests).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ._config import LMConfig
from ._modules import ModuleList
from ._quant import Int8Linear, int8_linear, project_add
from ._transformer import GatedFFN, make_norm


class DepformerAttention(nn.Module):
    """Self-attention of one depformer layer, with one stacked set of projection weights per step."""

    def __init__(self, dim: int, num_heads: int, num_weights: int):
        super().__init__()
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(num_weights * 3 * dim, dim))
        self.in_proj_scale: torch.Tensor | None
        self.register_buffer("in_proj_scale", None)  # the per-row scales once quantized (int8 weights)
        self.out_proj: nn.Linear | Int8Linear = nn.Linear(dim, num_weights * dim, bias=False)

    def project_in(self, x: torch.Tensor, step: int, out: torch.Tensor) -> None:
        """Step ``step``'s fused input projection of ``x`` ``[B, dim]``, written into ``out`` ``[B, 3 * dim]``."""
        weight, scale = _step_rows(self.in_proj_weight, self.in_proj_scale, step, 3)
        if scale is None:
            torch.mm(x, weight.t(), out=out)  # F.linear's product, straight into the cache
        else:
            out.copy_(int8_linear(x, weight, scale))

    def add_out(self, residual: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
        """``residual`` plus step ``step``'s output projection of ``x`` (one kernel: ``addmm``)."""
        return project_add(
            residual, x, *_step_rows(self.out_proj.weight, getattr(self.out_proj, "scale", None), step, 1)
        )


def _step_rows(
    weight: torch.Tensor, scale: torch.Tensor | None, step: int, parts: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step ``step``'s rows of a weight stacked per step (``parts * dim`` rows each), with their scales."""
    rows = parts * weight.shape[1]
    i = step if weight.shape[0] > rows else 0
    return weight[i * rows : (i + 1) * rows], None if scale is None else scale[i * rows : (i + 1) * rows]


class DepformerLayer(nn.Module):
    """One depformer layer: attention and a gated FFN, each step with its own FFN when weights are per step."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        dim, per_step = cfg.depformer_dim, cfg.depformer_weights_per_step
        n = cfg.dep_q if per_step else 1
        self.self_attn = DepformerAttention(dim, cfg.depformer_num_heads, n)
        self.norm1 = make_norm(cfg.norm, dim)
        self.norm2 = make_norm(cfg.norm, dim)
        self.gating: ModuleList[GatedFFN] | GatedFFN
        if per_step:
            self.gating = ModuleList(GatedFFN(dim, cfg.depformer_hidden(s), cfg.gating) for s in range(n))
        else:
            self.gating = GatedFFN(dim, cfg.depformer_hidden(0), cfg.gating)

    def ffn(self, step: int) -> GatedFFN:
        """The gated FFN that step ``step`` uses (the shared one when weights are not per step)."""
        return self.gating[step] if isinstance(self.gating, nn.ModuleList) else self.gating


@dataclasses.dataclass
class DepformerCache:
    """Per-frame queries, keys and values of every step, ``[L, steps, B, 3 * dim]`` (as the fused projection
    makes them, which writes them in place: one step's block is contiguous); overwritten every frame."""

    qkv: torch.Tensor


class Depformer(nn.Module):
    """The ``depformer`` transformer of the LM (its inputs and heads live on the LM)."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.num_steps = cfg.dep_q
        self.num_heads = cfg.depformer_num_heads
        self.layers = ModuleList(DepformerLayer(cfg) for _ in range(cfg.depformer_num_layers))

    def init_cache(self, batch_size: int) -> DepformerCache:
        """A zeroed per-frame cache for ``batch_size`` rows, in the weights' dtype (not int8's) and on their device."""
        p = self.layers[0].self_attn.in_proj_weight
        dtype = next(self.layers[0].norm1.parameters()).dtype  # the weights' dtype: int8 ones say nothing
        shape = (len(self.layers), self.num_steps, batch_size, 3 * p.shape[1])
        return DepformerCache(torch.zeros(shape, device=p.device, dtype=dtype))

    def forward(self, x: torch.Tensor, step: int, cache: DepformerCache) -> torch.Tensor:
        """One step for every row: ``x`` ``[B, dim]`` -> ``[B, dim]``; step ``s`` attends to steps ``0..s``.

        That is how the depformer is trained and how Kyutai's ``moshi`` 0.2
        runs it.  NVIDIA's fork keeps these keys in a ring of ``num_steps``
        slots with the one-key-short labelling of the temporal ring, so its
        very last step (15, a user codebook whose prediction is discarded)
        does not see step 0; no output token depends on that step.
        """
        b = x.shape[0]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            qkv = cache.qkv[i, : step + 1]  # steps 0..step
            attn.project_in(layer.norm1(x), step, qkv[step])
            q, k, v = qkv.view(step + 1, b, 3, self.num_heads, -1).permute(2, 1, 3, 0, 4)  # [B, H, steps, Dh]
            # One key: its softmax weight is exactly 1, the output its value.
            att = v if step == 0 else F.scaled_dot_product_attention(q[:, :, step:], k, v)
            x = attn.add_out(x, att.reshape(b, -1), step)
            x = layer.ffn(step)(layer.norm2(x), residual=x)
        return x
