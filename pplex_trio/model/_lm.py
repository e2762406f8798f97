"""The Moshi / PersonaPlex language model: weights and the two halves of a step.

One frame is 17 token streams (text, 8 agent codebooks, 8 user codebooks).
A step embeds the frame (sum of one embedding per stream, or a stored
voice-prompt embedding instead), runs the temporal transformer one
position further (ring KV cache of ``context`` frames), produces the text
logits, and then the depformer predicts the audio codebooks one by one.

This module only computes; which tokens go in, which are forced and which
come out is the job of :mod:`~pplex_trio.model._lockstep`.
"""

from __future__ import annotations

import torch
from torch import nn

from ._config import LMConfig
from ._depformer import Depformer, DepformerCache
from ._quant import Precision, WeightFormat, fused_int8, quantize_lm_
from ._transformer import StreamingTransformer, TransformerState, make_norm


class LMModel(nn.Module):
    """The LM's weights: stream embeddings, the temporal transformer, the text head, the depformer and its heads."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        dim, ddim = cfg.dim, cfg.depformer_dim
        self.emb = nn.ModuleList(nn.Embedding(cfg.card + 1, dim) for _ in range(cfg.n_q))
        self.text_emb = nn.Embedding(cfg.text_card + 1, dim)
        self.transformer = StreamingTransformer(cfg.temporal)
        self.out_norm = make_norm(cfg.norm, dim)
        self.text_linear = nn.Linear(dim, cfg.text_card, bias=False)
        num_in = cfg.dep_q if cfg.depformer_multi_linear else 1
        self.depformer_in = nn.ModuleList(nn.Linear(dim, ddim, bias=False) for _ in range(num_in))
        self.depformer_emb = nn.ModuleList(nn.Embedding(cfg.card + 1, ddim) for _ in range(cfg.dep_q - 1))
        self.depformer_text_emb = nn.Embedding(cfg.text_card + 1, ddim)
        self.depformer = Depformer(cfg)
        self.linears = nn.ModuleList(nn.Linear(ddim, cfg.card, bias=False) for _ in range(cfg.dep_q))
        self.precision = Precision()  # what load_model made of the weights, and how rings are stored

    def set_precision(self, precision: Precision) -> None:
        """Quantize the weights (in place, on their device) and choose the KV ring's format."""
        if precision.weights is WeightFormat.INT8 and self.precision.weights is WeightFormat.NONE:
            quantize_lm_(self, self.dtype)
            fused_int8(self.device, self.dtype)
        self.precision = precision

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the (unquantized) weights, read from the text embedding."""
        return self.text_emb.weight.dtype

    @property
    def device(self) -> torch.device:
        """The device the weights live on."""
        return self.text_emb.weight.device

    def initial_tokens(self) -> torch.Tensor:
        """The "start of sequence" token of each stream: ``[K]`` (text_card, then card)."""
        c = self.cfg
        tokens = torch.full((c.num_streams,), c.card, dtype=torch.long, device=self.device)
        tokens[0] = c.text_card
        return tokens

    def init_state(self, batch_size: int) -> TransformerState:
        """A fresh temporal-transformer state (KV rings) for ``batch_size`` rows, in the precision's KV format."""
        return self.transformer.init_state(batch_size, kv=self.precision.kv_cache)

    def init_depformer_cache(self, batch_size: int) -> DepformerCache:
        """A zeroed depformer cache for ``batch_size`` rows."""
        return self.depformer.init_cache(batch_size)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Sum of the stream embeddings of ``tokens`` ``[B, K]``: ``[B, dim]``."""
        x = self.emb[0](tokens[:, 1])
        for k in range(1, self.cfg.n_q):
            x = x + self.emb[k](tokens[:, 1 + k])
        return x + self.text_emb(tokens[:, 0])

    def temporal(
        self, x: torch.Tensor, state: TransformerState, exec_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One temporal step: ``x`` ``[B, dim]`` -> (normed output ``[B, dim]``, text logits ``[B, text_card]``)."""
        h = self.out_norm(self.transformer(x.unsqueeze(1), state, exec_mask))[:, 0]
        return h, self.text_linear(h)

    def depformer_step(self, h: torch.Tensor, previous: torch.Tensor, step: int, cache: DepformerCache) -> torch.Tensor:
        """Logits ``[B, card]`` of codebook ``step`` given the previous token ``[B]``."""
        x = self.depformer_in[step if len(self.depformer_in) > 1 else 0](h)
        emb = self.depformer_text_emb if step == 0 else self.depformer_emb[step - 1]
        x = x + emb(previous)
        return self.linears[step](self.depformer(x, step, cache))
