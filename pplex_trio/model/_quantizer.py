"""Mimi's split residual vector quantizer.

Two RVQs read the same latent: ``rvq_first`` (one "semantic" codebook) and
``rvq_rest`` (the acoustic ones, each quantizing what the previous left
over).  Each has its own 1x1 input and output projections; decoding sums
both.  Codebook vectors are ``embedding_sum / cluster_usage`` (the EMA
statistics Kyutai stores), computed once after loading.  A file may hold
more codebooks than are used (32 stored, 8 used): all are loaded, the
first ``num_codebooks`` are used.
"""

from __future__ import annotations

import torch
from torch import nn

from ._config import QuantizerConfig
from ._conv import Named
from ._modules import ModuleList


class Codebook(nn.Module):
    """One VQ codebook, kept as Kyutai's EMA statistics; :meth:`refresh` derives the vectors after a load."""

    _initialized: torch.Tensor  # buffers (register_buffer below)
    cluster_usage: torch.Tensor
    embedding_sum: torch.Tensor
    centroids: torch.Tensor
    norms: torch.Tensor

    def __init__(self, dim: int, bins: int, epsilon: float):
        super().__init__()
        self.epsilon = epsilon
        self.register_buffer("_initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(bins))
        self.register_buffer("embedding_sum", torch.zeros(bins, dim))
        self.register_buffer("centroids", torch.zeros(bins, dim), persistent=False)
        self.register_buffer("norms", torch.zeros(bins), persistent=False)  # |c|^2 of each vector

    def refresh(self) -> None:
        """Recompute the codebook vectors from the stored statistics (call after loading)."""
        usage = self.cluster_usage.clamp(min=self.epsilon)[:, None]
        self.centroids = self.embedding_sum / usage
        self.norms = (self.centroids * self.centroids).sum(-1)

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the nearest codebook vector for each row of ``x`` [N, dim]."""
        # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 does not change the argmin.
        scores = self.norms - 2 * x @ self.centroids.t()
        return scores.argmin(dim=-1)

    def nearest_fused(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`nearest` in one kernel less than two: the distances as one ``addmm`` (the norms as its bias).
        The same formula, rounded differently (the product's scaling and the bias inside the GEMM)."""
        return torch.addmm(self.norms, x, self.centroids.t(), alpha=-2).argmin(dim=-1)


class VectorQuantization(nn.Module):
    """A wrapper holding one codebook under the checkpoints' parameter name (``_codebook``)."""

    def __init__(self, dim: int, bins: int, epsilon: float):
        super().__init__()
        self._codebook = Codebook(dim, bins, epsilon)


class ResidualVQ(nn.Module):
    """Residual VQ: each codebook quantizes what the ones before it left, between input and output projections."""

    def __init__(self, cfg: QuantizerConfig, n_q: int):
        super().__init__()
        self.input_proj = nn.Conv1d(cfg.input_dimension, cfg.dimension, 1, bias=False)
        self.output_proj = nn.Conv1d(cfg.dimension, cfg.output_dimension, 1, bias=False)
        self.vq = Named(
            "layers", ModuleList(VectorQuantization(cfg.dimension, cfg.bins, cfg.epsilon) for _ in range(n_q))
        )

    def codebooks(self, n: int) -> list[Codebook]:
        """The first ``n`` codebooks, in residual order."""
        return [layer._codebook for layer in self.vq.layers[:n]]

    def encode(self, x: torch.Tensor, n: int, exact: int | None = None) -> torch.Tensor:
        """``[B, C, T]`` latents to ``[B, n, T]`` codes (``exact``: :meth:`encode_list`)."""
        return torch.stack(self.encode_list(x, n, exact), dim=1)

    def encode_list(self, x: torch.Tensor, n: int, exact: int | None = None) -> list[torch.Tensor]:
        """:meth:`encode`'s codes, one ``[B, T]`` per codebook.

        The first ``exact`` levels (all by default) are computed as they always
        were, bit for bit (:meth:`Codebook.nearest`'s 4 kernels, a gather, a
        subtraction); the levels past them in 4 (:meth:`Codebook.nearest_fused`'s
        2), their distances rounded differently.  Each level reads only the ones before it, so the first
        ``exact`` codes do not depend on how the later ones are computed.
        """
        b, _, t = x.shape
        residual = self.input_proj(x).transpose(1, 2).reshape(b * t, -1)
        exact = n if exact is None else exact
        codes = []
        for k, cb in enumerate(self.codebooks(n)):
            idx = cb.nearest(residual) if k < exact else cb.nearest_fused(residual)
            residual = residual - cb.centroids[idx]
            codes.append(idx.view(b, t))
        return codes

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, n, T]`` codes to ``[B, C_out, T]`` latents."""
        out = None
        for k, cb in enumerate(self.codebooks(codes.shape[1])):
            q = cb.centroids[codes[:, k]]  # [B, T, dim]
            out = q if out is None else out + q
        if out is None:
            raise ValueError("no codebook to decode: codes have shape [B, 0, T]")
        return self.output_proj(out.transpose(1, 2))


class SplitResidualVQ(nn.Module):
    """Mimi's quantizer: a semantic residual VQ for the first codebook(s), a second one for the acoustic rest."""

    def __init__(self, cfg: QuantizerConfig):
        super().__init__()
        self.n_semantic = cfg.n_q_semantic
        self.rvq_first = ResidualVQ(cfg, cfg.n_q_semantic)
        self.rvq_rest = ResidualVQ(cfg, cfg.n_q - cfg.n_q_semantic)

    def refresh(self) -> None:
        """Recompute every codebook's vectors from its statistics; call after loading weights."""
        for module in self.modules():
            if isinstance(module, Codebook):
                module.refresh()

    def encode(self, x: torch.Tensor, num_codebooks: int, exact: int | None = None) -> torch.Tensor:
        """``[B, C, T]`` latents to ``[B, num_codebooks, T]`` codes, semantic ones first; the first ``exact`` (all
        by default) bit for bit as always, the rest the cheaper way (:meth:`ResidualVQ.encode_list`)."""
        exact = num_codebooks if exact is None else exact
        first = self.rvq_first.encode_list(x, self.n_semantic, exact)
        rest = self.rvq_rest.encode_list(x, num_codebooks - self.n_semantic, exact - self.n_semantic)
        return torch.stack(first + rest, dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[B, n, T]`` codes (semantic first; acoustic ones optional) to ``[B, C, T]`` latents."""
        out = self.rvq_first.decode(codes[:, : self.n_semantic])
        if codes.shape[1] > self.n_semantic:
            out = out + self.rvq_rest.decode(codes[:, self.n_semantic :])
        return out
