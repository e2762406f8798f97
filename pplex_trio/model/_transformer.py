"""A streaming transformer with a ring KV cache: Helium (the LM) and Mimi's.

Parameter names follow the checkpoints (``layers.{i}.self_attn.in_proj_weight``,
``norm1.alpha``, ``gating.linear_in.weight``, ``linear1.weight``,
``layer_scale_1.scale`` ...), so a state dict loads without renaming.

One step processes ``T`` new positions per row (1 for the LM, 2 for Mimi's
transformers, which run at 25 Hz inside a 12.5 Hz frame).  The KV cache is
a ring of ``context`` slots per row; see
:func:`~pplex_trio.model._streaming.ring_attention_mask` for exactly which
keys a query sees once the ring is full (it depends on
``TransformerConfig.reference``).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ._config import TransformerConfig, gated_hidden
from ._modules import ModuleList
from ._quant import KVFormat, dequantize_fp8, project, project_add, quantize_fp8
from ._streaming import (
    additive_mask,
    apply_rope_,
    prefill_attention_mask,
    reset_rows_,
    ring_attention_mask,
    rope_rotation,
    set_rows_,
)


class RMSNorm(nn.Module):
    """RMS norm.  Helium's ``rms_norm_f32`` computes in float32, and so does ``F.rms_norm`` for a bfloat16
    input: it upcasts, multiplies by the weight in float32 and rounds once, one kernel on CUDA.  Casting the
    input and the weight first gave the same bits (checked on the CPU) for three more kernels a norm."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., dim]`` -> ``[..., dim]``, normalized by the root mean square and scaled by ``alpha``."""
        return F.rms_norm(x, (x.shape[-1],), self.alpha.view(-1).to(x.dtype), self.eps)


class LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch (Mimi's transformer)."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., dim]`` -> ``[..., dim]``, each channel multiplied by its scale."""
        return self.scale * x


def make_norm(kind: str, dim: int) -> nn.Module:
    """The norm module named ``kind`` (``rms_norm_f32``, ``rms_norm``, ``layer_norm``); ``ValueError`` for others."""
    if kind == "rms_norm_f32":
        return RMSNorm(dim, eps=1e-8)
    if kind == "rms_norm":
        return RMSNorm(dim, eps=1e-5)
    if kind == "layer_norm":
        return nn.LayerNorm(dim, eps=1e-5)
    raise ValueError(f"unsupported norm {kind!r}")


def activation(name: str):
    """The ``torch.nn.functional`` activation named ``name`` (silu, gelu, relu, elu); ``ValueError`` for others."""
    if name in ("silu", "gelu", "relu", "elu"):
        return getattr(F, name)
    raise ValueError(f"unsupported activation {name!r}")


class GatedFFN(nn.Module):
    """``linear_out(act(a) * b)`` where ``[a, b] = linear_in(x)``; with a ``residual``, that plus it (one kernel:
    :func:`~pplex_trio.model._quant.project_add`)."""

    def __init__(self, dim: int, hidden: int, act: str):
        super().__init__()
        self.act = activation(act)
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., dim]`` -> ``[..., dim]``; with ``residual`` (same shape), the sum in one kernel."""
        h = self.linear_in(x)
        h = h.view(*h.shape[:-1], 2, -1)
        h = self.act(h[..., 0, :]) * h[..., 1, :]
        if residual is None:
            return self.linear_out(h)
        return project_add(residual, h, self.linear_out.weight, getattr(self.linear_out, "scale", None))


class Attention(nn.Module):
    """Fused-QKV multi-head attention (no biases), keys/values read from the ring."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_scale: torch.Tensor | None
        self.register_buffer("in_proj_scale", None)  # the per-row scales once quantized (int8 weights)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def qkv(self, x: torch.Tensor, rotation: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries ``[B, H, T, Dh]`` and keys and values ``[2, B, H, T, Dh]`` of ``x`` ``[B, T, dim]`` (views
        of one projection); with a RoPE ``rotation`` (:func:`~pplex_trio.model._streaming.rope_rotation`),
        queries and keys rotated together."""
        b, t, _ = x.shape
        qkv = project(x, self.in_proj_weight, self.in_proj_scale).view(b, t, 3, self.num_heads, -1)
        if rotation is not None:
            apply_rope_(qkv[:, :, :2], rotation)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1:]


class TransformerLayer(nn.Module):
    """One pre-norm transformer layer: ring self-attention, then a plain GELU or a gated FFN, each optionally
    layer-scaled.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = Attention(cfg.d_model, cfg.num_heads)
        self.norm1 = make_norm(cfg.norm, cfg.d_model)
        self.norm2 = make_norm(cfg.norm, cfg.d_model)
        if cfg.gating == "none":
            self.linear1 = nn.Linear(cfg.d_model, cfg.dim_feedforward, bias=False)
            self.linear2 = nn.Linear(cfg.dim_feedforward, cfg.d_model, bias=False)
        else:
            self.gating = GatedFFN(cfg.d_model, gated_hidden(cfg.d_model, cfg.dim_feedforward), cfg.gating)
        if cfg.layer_scale is not None:
            self.layer_scale_1 = LayerScale(cfg.d_model)
            self.layer_scale_2 = LayerScale(cfg.d_model)
        self._gated = cfg.gating != "none"
        self._scaled = cfg.layer_scale is not None

    def add_attention(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """``x`` plus the output projection of the attention ``att`` (times the layer scale): one kernel
        (``addmm``, or ``addcmul`` after the projection where there is a layer scale)."""
        out = self.self_attn.out_proj
        if self._scaled:
            return torch.addcmul(x, self.layer_scale_1.scale, out(att))
        return project_add(x, att, out.weight, getattr(out, "scale", None))

    def add_ffn(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` plus the feed-forward of its norm (times the layer scale), the add folded as in
        :meth:`add_attention`."""
        h = self.norm2(x)
        if self._scaled:
            f = self.gating(h) if self._gated else self.linear2(F.gelu(self.linear1(h)))
            return torch.addcmul(x, self.layer_scale_2.scale, f)
        if self._gated:
            return self.gating(h, residual=x)
        return project_add(x, F.gelu(self.linear1(h)), self.linear2.weight, getattr(self.linear2, "scale", None))


@dataclasses.dataclass
class TransformerState:
    """Ring KV cache of every layer plus the number of positions each row has seen.

    ``kv`` holds the keys and then the values, so that one operation writes
    both.  Each ring has one slot more than the context: the last one is a
    spare that attention never reads, where rows that do not execute write
    (so their slots keep what they hold without being read back first).
    The transformer reads and writes the ring only through the methods
    below, so :class:`Fp8TransformerState` can store it in 8 bits.
    """

    kv: torch.Tensor  # [2, L, B, H, context + 1, Dh]: keys, values
    end: torch.Tensor  # [B] long: positions written so far

    @property
    def keys(self) -> torch.Tensor:
        """``[L, B, H, context, Dh]`` (a view)."""
        return self.kv[0, ..., :-1, :]

    @property
    def values(self) -> torch.Tensor:
        """``[L, B, H, context, Dh]`` (a view)."""
        return self.kv[1, ..., :-1, :]

    def reset(self, mask: torch.Tensor) -> None:
        """Empty the rings of the rows selected by ``mask`` [B] (their position count back to 0), in place."""
        # Old keys need no clearing: positions >= end are never attended.
        reset_rows_(self.end, mask, 0)

    def write(self, layer: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Every row's keys and values ``kv`` ``[2, B, H, T, Dh]`` at ring ``slots`` ``[B, T]``."""
        b, t = slots.shape
        self.kv[:, layer].scatter_(3, slots.view(1, b, 1, t, 1).expand(kv.shape), kv.to(self.kv.dtype))

    def read(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's keys and values ``[B, H, context, Dh]`` in ``dtype``."""
        return self.kv[0, layer, ..., :-1, :].to(dtype), self.kv[1, layer, ..., :-1, :].to(dtype)

    def write_row(self, layer: int, row: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Row ``row``'s keys and values ``kv`` ``[2, H, T, Dh]`` at ring ``slots`` ``[T]``."""
        self.kv[:, layer, row].index_copy_(2, slots, kv.to(self.kv.dtype))

    def read_row(self, layer: int, row: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``row``'s keys and values of one layer, ``[H, context, Dh]`` each, in ``dtype``."""
        return self.kv[0, layer, row, :, :-1].to(dtype), self.kv[1, layer, row, :, :-1].to(dtype)


@dataclasses.dataclass
class Fp8TransformerState(TransformerState):
    """The ring in fp8 (``uint8`` storage) with one scale per position and head (``--kv-cache fp8``)."""

    scales: torch.Tensor = dataclasses.field(default_factory=lambda: torch.empty(0))  # [2, L, B, H, context + 1]

    @property
    def key_scales(self) -> torch.Tensor:
        """``[L, B, H, context]`` (a view)."""
        return self.scales[0, ..., :-1]

    @property
    def value_scales(self) -> torch.Tensor:
        """``[L, B, H, context]`` (a view)."""
        return self.scales[1, ..., :-1]

    def write(self, layer: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
        b, t = slots.shape
        index = slots.view(1, b, 1, t, 1).expand(kv.shape)
        data, scale = quantize_fp8(kv)
        self.kv[:, layer].scatter_(3, index, data)
        self.scales[:, layer].scatter_(3, index[..., 0], scale)

    def read(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = dequantize_fp8(self.kv[:, layer, ..., :-1, :], self.scales[:, layer, ..., :-1], dtype)
        return keys, values

    def write_row(self, layer: int, row: int, slots: torch.Tensor, kv: torch.Tensor) -> None:
        data, scale = quantize_fp8(kv)
        self.kv[:, layer, row].index_copy_(2, slots, data)
        self.scales[:, layer, row].index_copy_(2, slots, scale)

    def read_row(self, layer: int, row: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = dequantize_fp8(self.kv[:, layer, row, :, :-1], self.scales[:, layer, row, :, :-1], dtype)
        return keys, values


class StreamingTransformer(nn.Module):
    """Causal transformer over ``[B, T, D]`` chunks, streaming through a ring KV cache."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_layers))

    def init_state(
        self,
        batch_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        kv: KVFormat = KVFormat.MODEL,
    ) -> TransformerState:
        """A fresh state (empty rings) for ``batch_size`` rows, by default on the weights' device and dtype; ``kv``
        picks the ring's storage (fp8 or the model's dtype).
        """
        norm = next(self.layers[0].norm2.parameters())  # the weights' dtype: int8 ones say nothing
        c = self.cfg
        shape = (2, c.num_layers, batch_size, c.num_heads, c.context + 1, c.d_model // c.num_heads)
        device = device or norm.device
        end = torch.zeros(batch_size, device=device, dtype=torch.long)
        if kv is KVFormat.FP8:
            return Fp8TransformerState(
                kv=torch.zeros(shape, device=device, dtype=torch.uint8),
                end=end,
                scales=torch.zeros(shape[:-1], device=device, dtype=torch.float32),
            )
        return TransformerState(kv=torch.zeros(shape, device=device, dtype=dtype or norm.dtype), end=end)

    def forward(self, x: torch.Tensor, state: TransformerState, exec_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``T = x.shape[1]`` new positions per row; returns ``[B, T, D]``.

        Rows where ``exec_mask`` is False compute (garbage) but write it
        to their ring's spare slot, and their ``end`` does not move: the
        step leaves what they attend to bit for bit as it was.
        """
        b, t, _ = x.shape
        capacity = self.cfg.context
        positions = state.end.view(-1, 1) + torch.arange(t, device=x.device)  # [B, T]
        slots = positions % capacity
        if exec_mask is not None:
            slots = torch.where(exec_mask.view(-1, 1), slots, capacity)  # the spare slot
        new_end = state.end + t
        mask = additive_mask(ring_attention_mask(new_end, t, capacity, self.cfg.reference), x.dtype)
        rotation = None
        if self.cfg.positional_embedding == "rope":
            rotation = rope_rotation(positions, self.cfg.d_model // self.cfg.num_heads, self.cfg.max_period)
        for i, layer in enumerate(self.layers):
            q, kv = layer.self_attn.qkv(layer.norm1(x), rotation)
            state.write(i, slots, kv)
            att = F.scaled_dot_product_attention(q, *state.read(i, q.dtype), mask)
            x = layer.add_ffn(layer.add_attention(x, att.transpose(1, 2).reshape(b, t, -1)))
        if exec_mask is None:
            state.end.copy_(new_end)
        else:
            set_rows_(state.end, exec_mask, new_end)
        return x

    def prefill_limit(self, start: int, wanted: int) -> int:
        """How many positions from ``start`` one :meth:`prefill` call may take, at most ``wanted``.

        A chunk writes all its keys before it attends, so a position written
        at ``p >= context`` overwrites ``p - context``, which an earlier query
        of the same chunk may still see (two queries back under
        ``"personaplex"``'s window of ``context - 1``, one back under
        ``"kyutai"``'s).  So chunks stop at the first wrap of the ring, and
        after it take one or two positions: a prompt shorter than the context
        (every real one) never meets this.
        """
        gap = 2 if self.cfg.reference == "personaplex" else 1
        room = self.cfg.context - start
        return max(1, min(wanted, room if room > gap else gap))

    def prefill(
        self, x: torch.Tensor, state: TransformerState, rows: list[int], starts: list[int], counts: list[int]
    ) -> None:
        """Teacher-forced positions of ``rows``: ``x`` ``[R, T, D]`` at positions ``starts[r] + t``.

        Row ``r`` takes its first ``counts[r]`` positions (the rest of its
        ``T`` are padding: computed, never written); each query sees exactly
        the keys its own step would have seen (the reference's window per
        position), read from the row's ring in place.  Nothing is returned:
        a prompt's outputs are discarded, only its keys and values stay.
        Every other row is untouched.  ``counts[r]`` must not exceed
        :meth:`prefill_limit` of ``starts[r]``; ``state.end`` of the rows
        must equal ``starts``.
        """
        r_count, t, _ = x.shape
        capacity = self.cfg.context
        device = x.device
        start = torch.tensor(starts, device=device)
        count = torch.tensor(counts, device=device)
        positions = start[:, None] + torch.arange(t, device=device)  # [R, T]
        mask = prefill_attention_mask(start, count, t, capacity, self.cfg.reference)  # [R, 1, T, C]
        mask = additive_mask(mask, x.dtype)
        slots = [torch.arange(s, s + n, device=device) % capacity for s, n in zip(starts, counts, strict=True)]
        rotation = None
        if self.cfg.positional_embedding == "rope":
            rotation = rope_rotation(positions, self.cfg.d_model // self.cfg.num_heads, self.cfg.max_period)
        for i, layer in enumerate(self.layers):
            q, kv = layer.self_attn.qkv(layer.norm1(x), rotation)
            outputs = []
            for j, row in enumerate(rows):
                state.write_row(i, row, slots[j], kv[:, j, :, : counts[j]])
                keys, values = state.read_row(i, row, q.dtype)  # [H, C, Dh]
                outputs.append(F.scaled_dot_product_attention(q[j : j + 1], keys[None], values[None], mask[j : j + 1]))
            att = (torch.cat(outputs) if len(outputs) > 1 else outputs[0]).transpose(1, 2).reshape(r_count, t, -1)
            x = layer.add_ffn(layer.add_attention(x, att))
        state.end[torch.tensor(rows, device=device)] = start + count
