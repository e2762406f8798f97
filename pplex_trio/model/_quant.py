"""8-bit weights (``--quantize int8``) and an 8-bit KV ring (``--kv-cache fp8``).

**Weights, w8a16.**  The projections of the temporal transformer and of the
depformer (the attention's fused input projection, its output projection,
the feed-forward layers: 93 % of PersonaPlex's LM parameters) are stored as int8 with
one float scale per output channel (symmetric, ``scale = max |w| / 127``);
activations stay in the LM's dtype.  Embeddings, norms, the output heads,
``depformer_in`` and Mimi stay as they are.  A quantized weight keeps its
checkpoint name and gains a ``*scale`` tensor beside it
(``self_attn.in_proj_weight`` + ``self_attn.in_proj_scale``,
``out_proj.weight`` + ``out_proj.scale``), which is also the layout of the
files ``pplex-trio quantize`` writes.

The product runs in ``torch._weight_int8pack_mm`` (one kernel: int8 weight,
per-channel scale, no full-precision copy of the weight) where the device
and dtype have it, as checked once per device and dtype by :func:`fused_int8`;
elsewhere the weight is converted to the activation's dtype, multiplied, and
scaled (a temporary copy of one weight at a time).

**KV ring, fp8.**  :class:`Fp8TransformerState` stores keys and values as
float8 e4m3 (in ``uint8`` storage: copies, gathers and scatters are byte
moves on every device) with one float scale per position and head
(``max |x| / 448`` over the head's dimension): 1 + 4/head_dim bytes per
value instead of 2 (bf16).  Attention reads one layer's ring at a time,
converted to the compute dtype, so the extra memory is one layer's ring
while that layer runs, on the CPU and on CUDA alike (no fused fp8
attention kernel is used).
"""

from __future__ import annotations

import logging
import re

import torch
import torch.nn.functional as F
from torch import nn

from .._precision import KVFormat, Precision, WeightFormat

logger = logging.getLogger(__name__)

__all__ = ["KVFormat", "Precision", "WeightFormat"]  # (re-exported for the model package)

INT8_MAX = 127
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
_TINY = 1e-12  # a scale is never zero: an all-zero channel quantizes to zeros times this


# --- int8 weights ---------------------------------------------------------------------

QUANTIZED_FILE_KEY = "pplex_trio.weights"
"""The safetensors metadata key that marks a file of ``pplex-trio quantize`` (its value: ``int8``)."""

_QUANTIZED = re.compile(
    r"^(transformer|depformer)\.layers\.\d+\.(self_attn\.in_proj_weight|self_attn\.out_proj\.weight|"
    r"gating\.(\d+\.)?linear_(in|out)\.weight|linear[12]\.weight)$"
)


def is_quantized_weight(name: str) -> bool:
    """Whether the LM parameter ``name`` is stored in int8 under ``--quantize int8``."""
    return _QUANTIZED.match(name) is not None


def scale_name(name: str) -> str:
    """The name of the scales of weight ``name`` (``in_proj_weight`` -> ``in_proj_scale``, ``x.weight`` ->
    ``x.scale``)."""
    return (
        name.removesuffix("weight") + "scale" if name.endswith(".weight") else name.removesuffix("_weight") + "_scale"
    )


def quantize_rows(weight: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` ``[N, K]`` -> (int8 ``[N, K]``, scales ``[N]`` in ``scale_dtype``): symmetric, per output row.

    Computed in float32 on ``weight``'s device, a block of rows at a time (the temporaries stay small
    whatever the weight's size); works on ``meta`` (shapes only).
    """
    quantized = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    if weight.is_meta:  # shapes only (a memory plan): the arithmetic would only cost seconds of meta dispatch
        return quantized, scales.to(scale_dtype)
    for start in range(0, weight.shape[0], _ROWS_PER_BLOCK):
        block = weight[start : start + _ROWS_PER_BLOCK].to(torch.float32, copy=True)  # never in place on the weight
        scale = (block.abs().amax(dim=1) / INT8_MAX).clamp_(min=_TINY)
        quantized[start : start + _ROWS_PER_BLOCK] = block.div_(scale[:, None]).round_().clamp_(-INT8_MAX, INT8_MAX)
        scales[start : start + _ROWS_PER_BLOCK] = scale
    return quantized, scales.to(scale_dtype)


_ROWS_PER_BLOCK = 1024


_FUSED: dict[tuple[str, torch.dtype], bool] = {}


def fused_int8(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._weight_int8pack_mm`` runs on ``device`` in ``dtype`` and agrees with the plain product
    (checked once, on a small product, and logged); ``meta`` counts as not (the plain path's temporaries are
    the larger ones, which is what memory planning wants)."""
    key = (device.type, dtype)
    if key not in _FUSED:
        _FUSED[key] = device.type != "meta" and _probe_fused(device, dtype)
        if device.type != "meta":
            logger.info(
                "int8 weights on %s in %s: %s",
                device.type,
                str(dtype).removeprefix("torch."),
                "fused kernel (_weight_int8pack_mm)" if _FUSED[key] else "converted per product",
            )
    return _FUSED[key]


def _probe_fused(device: torch.device, dtype: torch.dtype) -> bool:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=generator).to(device, dtype)
    weight, scale = quantize_rows(torch.randn(64, 256, generator=generator).to(device), dtype)
    try:
        fused = torch._weight_int8pack_mm(x, weight, scale)
    except (RuntimeError, NotImplementedError):
        return False
    plain = F.linear(x.float(), weight.float()) * scale.float()
    return bool(torch.allclose(fused.float(), plain, rtol=2e-2, atol=2e-2 * float(plain.abs().max())))


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x @ (weight * scale[:, None]).T`` for an int8 ``weight`` ``[N, K]``, in ``x``'s dtype."""
    flat = x.reshape(-1, x.shape[-1])
    if _FUSED.get((x.device.type, x.dtype), False):
        out = torch._weight_int8pack_mm(flat.contiguous(), weight, scale.to(x.dtype))
    else:
        out = F.linear(flat, weight.to(x.dtype)) * scale.to(x.dtype)
    return out.view(*x.shape[:-1], weight.shape[0])


def project(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight)``, or its int8 form when the weight has scales."""
    return F.linear(x, weight) if scale is None else int8_linear(x, weight, scale)


def project_add(
    residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None
) -> torch.Tensor:
    """``residual + F.linear(x, weight)``: with a float weight one kernel (``addmm``, the residual as its input)
    instead of a product and an add.  In float32 the bits are the same (the product is added to the residual
    as it leaves the accumulator); in bfloat16 the sum is rounded once, not twice.  An int8 weight adds its
    product as before."""
    if scale is not None:
        return residual + int8_linear(x, weight, scale)
    out = torch.addmm(residual.reshape(-1, residual.shape[-1]), x.reshape(-1, x.shape[-1]), weight.t())
    return out.view(residual.shape)


class Int8Linear(nn.Module):
    """A bias-free ``nn.Linear`` with an int8 ``weight`` and per-output-channel ``scale`` (buffers)."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.weight: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in]`` -> ``[..., out]``, through the int8 weight and its scales."""
        return int8_linear(x, self.weight, self.scale)


def quantize_lm_(lm: nn.Module, scale_dtype: torch.dtype) -> int:
    """Store ``lm``'s quantizable weights (:func:`is_quantized_weight`) in int8, in place, one weight at a time
    (so the peak is the model plus one weight's float32 copy).  Works on any device, ``meta`` included.
    Returns the number of weights quantized."""
    count = 0
    for name, _ in list(lm.named_parameters()):
        if not is_quantized_weight(name):
            continue
        owner_name, _, attr = name.rpartition(".")
        owner = lm.get_submodule(owner_name)
        weight, scale = quantize_rows(getattr(owner, attr).detach(), scale_dtype)
        if isinstance(owner, nn.Linear):
            parent_name, _, child = owner_name.rpartition(".")
            lm.get_submodule(parent_name).register_module(child, Int8Linear(weight, scale))
        else:  # a bare parameter (``in_proj_weight``): int8 beside its scales
            delattr(owner, attr)
            owner.register_buffer(attr, weight)
            owner.register_buffer(attr.removesuffix("_weight") + "_scale", scale)
        count += 1
    return count


# --- fp8 KV ring ----------------------------------------------------------------------


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[..., D]`` -> (fp8 bytes as ``uint8`` ``[..., D]``, float32 scale ``[...]``), one scale per vector."""
    x = x.float()
    scale = (x.abs().amax(dim=-1) / FP8_MAX).clamp(min=_TINY)
    return (x / scale[..., None]).to(FP8).view(torch.uint8), scale


def dequantize_fp8(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8`, in ``dtype``."""
    return data.view(FP8).to(dtype).mul_(scale[..., None].to(dtype))
