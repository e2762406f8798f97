"""Strict state-dict loading, and the one documented exception to strictness.

Every tensor of the file must be consumed and every parameter filled: a
checkpoint that does not match the architecture fails loudly, with the
missing and unexpected keys listed, instead of running with random weights.

The exception is the reference's depformer expansion: PersonaPlex runs 16
depformer steps, and NVIDIA's loader copies steps 0-7 into 8-15 when a
checkpoint only has 8 (:func:`expand_depformer_steps`).
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

_MAX_LISTED = 25


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not match the model built from the config."""


def _listing(title: str, keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_LISTED])
    more = f" (and {len(keys) - _MAX_LISTED} more)" if len(keys) > _MAX_LISTED else ""
    return f"{title} ({len(keys)}): {shown}{more}"


def load_state_dict_strict(
    module: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    *,
    what: str = "checkpoint",
    dtype: torch.dtype | None = None,
) -> None:
    """Load ``state_dict`` into ``module``, requiring an exact match of names and shapes.

    Floating-point tensors are cast to ``dtype`` (default: the dtype of the
    parameter they replace).  Tensors are assigned, not copied, so a module
    built on the ``meta`` device is materialised by this call.

    Error handling: raises :class:`CheckpointMismatchError` naming every
    missing, unexpected and wrongly shaped key.
    """
    expected = module.state_dict(keep_vars=True)
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    wrong = sorted(
        f"{k} {tuple(state_dict[k].shape)} (expected {tuple(expected[k].shape)})"
        for k in set(expected) & set(state_dict)
        if tuple(state_dict[k].shape) != tuple(expected[k].shape)
    )
    if missing or unexpected or wrong:
        parts = [f"{what} does not match the model built from its config"]
        if missing:
            parts.append(_listing("missing keys", missing))
        if unexpected:
            parts.append(_listing("unexpected keys", unexpected))
        if wrong:
            parts.append(_listing("wrong shapes", wrong))
        parts.append("check that config.json describes these weights (or pick the right --model)")
        raise CheckpointMismatchError(";\n".join(parts))
    converted = {}
    for key, value in state_dict.items():
        target = expected[key]
        if value.dtype.is_floating_point:
            value = value.to(dtype or target.dtype)
        converted[key] = value
    module.load_state_dict(converted, strict=True, assign=True)
    module.requires_grad_(False)


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def safetensors_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file (empty when it has none)."""
    return dict(_header(path)[0].get("__metadata__") or {})


def read_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a safetensors file one at a time, read into ordinary CPU memory.

    Unlike ``safetensors``' own loaders this does not map the file: every
    page of a mapped file stays in the process's resident memory until it is
    unmapped, so a loader that quantizes or moves tensors one by one would
    still peak at the whole file.  Here the caller holds only what it keeps.
    """
    header, start = _header(path)
    with open(path, "rb") as f:
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            data = torch.empty(end - begin, dtype=torch.uint8)
            f.seek(start + begin)
            if f.readinto(data.numpy().data) != end - begin:
                raise CheckpointMismatchError(f"{path} is truncated (tensor {name})")
            yield name, data.view(_SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def _header(path: Path) -> tuple[dict[str, dict], int]:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size)), 8 + size


_PER_STEP = re.compile(r"^(depformer_in|depformer_emb|linears|depformer\.layers\.\d+\.gating)\.(\d+)\.(.*)$")


def expand_depformer_steps(state_dict: dict[str, torch.Tensor], dep_q: int) -> bool:
    """Copy depformer steps 0-7 into 8-15 in place, as NVIDIA's loader does.

    Applies only when the model has ``dep_q == 16`` and the file has 8 steps
    (a Moshi-layout checkpoint run as PersonaPlex).  Per-step weights
    (``depformer_in``, ``linears``, ``gating``) of step ``s + 8`` become
    copies of step ``s``; the stacked ``self_attn`` weights are concatenated
    with themselves.  ``depformer_emb.{s}`` feeds step ``s + 1``, so the
    file has 0-6 and ``depformer_emb.7`` (the input of step 8) has no
    source: the reference leaves it uninitialised; we fill it with zeros.
    It only influences step 8, a user codebook whose prediction is never
    used.  Returns whether anything was expanded.
    """
    if dep_q != 16 or "linears.8.weight" in state_dict or "linears.7.weight" not in state_dict:
        return False
    for key in list(state_dict):
        m = _PER_STEP.match(key)
        if m and int(m.group(2)) < 8:
            new_key = f"{m.group(1)}.{int(m.group(2)) + 8}.{m.group(3)}"
            if m.group(1) == "depformer_emb" and int(m.group(2)) + 8 >= dep_q - 1:
                continue
            state_dict[new_key] = state_dict[key]
        elif key.startswith("depformer.layers.") and ".self_attn." in key:
            state_dict[key] = torch.cat([state_dict[key], state_dict[key]], dim=0)
    if "depformer_emb.7.weight" not in state_dict and "depformer_emb.0.weight" in state_dict:
        state_dict["depformer_emb.7.weight"] = torch.zeros_like(state_dict["depformer_emb.0.weight"])
    logger.info("expanded the depformer from 8 to 16 steps (steps 8-15 copy 0-7, as the reference does)")
    return True


_SPLIT_PROJ = re.compile(r"^(.*\.self_attn)\.(in_projs|out_projs)\.(\d+)\.weight$")


def convert_kyutai_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Kyutai 0.2.x live-module layout to the file layout we load.

    A live Kyutai ``StreamingMultiheadAttention`` keeps one linear per step
    (``self_attn.in_projs.{i}.weight``); files and our modules keep them
    stacked (``self_attn.in_proj_weight``, ``self_attn.out_proj.weight``).
    Other keys pass through unchanged.
    """
    out: dict[str, torch.Tensor] = {}
    groups: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in state_dict.items():
        m = _SPLIT_PROJ.match(key)
        if m is None:
            out[key] = value
            continue
        name = f"{m.group(1)}.{'in_proj_weight' if m.group(2) == 'in_projs' else 'out_proj.weight'}"
        groups.setdefault(name, {})[int(m.group(3))] = value
    for name, parts in groups.items():
        out[name] = torch.cat([parts[i] for i in sorted(parts)], dim=0)
    return out
