"""Small shared pieces of the streaming machinery: the state's contract, row masks, the ring rule, RoPE.

Every streaming module in this package keeps its memory in an explicit
state object created by ``module.init_state(batch_size)``.  A state
(:class:`StreamingState`) has one row per conversation slot and
``reset(mask)`` puts the masked rows back to "fresh" in place, leaving the
other rows untouched (bit for bit).  Forward
calls take an ``exec_mask``: rows where it is False may compute garbage but
their state does not move, so an idle or prefilling row never disturbs its
own future either.

Shapes are static: caches are preallocated at full size and addressed by
position tensors, so a step could be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch


class StreamingState(Protocol):
    """A streaming module's state: one row per conversation slot.  ``reset(mask)`` (bool ``[B]``) puts the
    masked rows back to fresh in place (static shapes: ``torch.where``, no reallocation) and leaves the other
    rows bit for bit, so one conversation restarts while the others go on."""

    def reset(self, mask: torch.Tensor) -> None:
        """Put the rows where ``mask`` (bool ``[B]``) is set back to fresh, in place; the others stay as they are."""


def where_rows(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` where the per-row ``mask`` [B] is set, else ``old`` (any trailing dims)."""
    return torch.where(mask.view(-1, *([1] * (new.dim() - 1))), new, old)


def set_rows_(tensor: torch.Tensor, mask: torch.Tensor, new: torch.Tensor) -> None:
    """In place, one operation: rows of ``tensor`` selected by ``mask`` [B] become ``new`` (broadcast)."""
    torch.where(mask.view(-1, *([1] * (tensor.dim() - 1))), new, tensor, out=tensor)


def reset_rows_(tensor: torch.Tensor, mask: torch.Tensor, value: torch.Tensor | float) -> None:
    """In place: rows of ``tensor`` selected by ``mask`` [B] become ``value``."""
    set_rows_(tensor, mask, torch.as_tensor(value, dtype=tensor.dtype, device=tensor.device))


def ring_attention_mask(end: torch.Tensor, num_new: int, capacity: int, reference: str) -> torch.Tensor:
    """Which ring slots each new query may attend to: bool ``[B, 1, num_new, capacity]``.

    ``end`` [B] is the number of positions written *including* the
    ``num_new`` just written.  Slot ``i`` holds the latest position
    ``p < end`` with ``p % capacity == i``.  A query at position ``q`` sees
    the keys of positions ``[max(0, end - window), q]``, where ``window``
    depends on the ``reference`` (see ``ModelConfig.reference``):

    * ``"personaplex"``: ``window = capacity - 1``.  NVIDIA's fork of
      Kyutai's ``RingKVCache`` labels the slot that holds the oldest key as
      a future position, so a full ring attends to one key fewer than it
      holds.  The golden data depends on it: a window of ``capacity`` keys
      diverges from it as soon as the ring is full.
    * ``"kyutai"``: ``window = capacity``.  Kyutai's ``moshi`` 0.2.13 labels
      every slot with its true position and masks keys more than
      ``context - 1`` positions before the query, so a full ring shows all
      its keys to the chunk's last query.
    """
    if reference not in ("personaplex", "kyutai"):
        raise ValueError(f"unknown reference {reference!r}")
    window = capacity - 1 if reference == "personaplex" else capacity
    slots = torch.arange(capacity, device=end.device)
    last = end.view(-1, 1) - 1
    # Latest position p <= last with p == slot (mod capacity); negative if never written.
    pos = (last - (last - slots) % capacity).view(-1, 1, capacity)
    first = (end - window).clamp(min=0).view(-1, 1, 1)  # the oldest position seen, never a negative one
    queries = end.view(-1, 1) - num_new + torch.arange(num_new, device=end.device)
    ok = (pos >= first) & (pos <= queries.unsqueeze(-1))
    return ok.unsqueeze(1)


def prefill_attention_mask(
    start: torch.Tensor, count: torch.Tensor, num_new: int, capacity: int, reference: str
) -> torch.Tensor:
    """The ring slots each query of a prefill chunk may see: bool ``[R, 1, num_new, capacity]``.

    Row ``r`` writes positions ``start[r] .. start[r] + count[r] - 1`` into
    its ring, then query ``q`` (position ``start[r] + t``) sees the keys of
    positions ``[max(0, q + 1 - window), q]``: exactly what its own step
    would have seen, one query per chunk (see :func:`ring_attention_mask`,
    whose chunks of Mimi's two steps share the window of their last query).
    Queries past ``count[r]`` are padding.
    """
    if reference not in ("personaplex", "kyutai"):
        raise ValueError(f"unknown reference {reference!r}")
    window = capacity - 1 if reference == "personaplex" else capacity
    slots = torch.arange(capacity, device=start.device)
    last = (start + count).view(-1, 1) - 1
    pos = (slots + capacity * torch.div(last - slots, capacity, rounding_mode="floor")).view(-1, 1, capacity)
    queries = (start.view(-1, 1) + torch.arange(num_new, device=start.device)).unsqueeze(-1)
    ok = (pos >= 0) & (pos >= queries + 1 - window) & (pos <= queries)
    return ok.unsqueeze(1)


def additive_mask(ok: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The boolean mask ``ok`` as attention turns it into an additive one (0 where seen, -inf elsewhere), in
    ``dtype``: made once per step for every layer, not again inside each layer's attention."""
    return torch.full(ok.shape, float("-inf"), dtype=dtype, device=ok.device).masked_fill_(ok, 0.0)


def rope_rotation(positions: torch.Tensor, dim: int, max_period: float) -> torch.Tensor:
    """Complex rotations ``[B, T, 1, 1, dim/2]`` for RoPE at ``positions`` ``[B, T]`` (shared by all layers):
    they broadcast over a projection's ``[B, T, parts, H, dim/2]`` pairs."""
    ds = torch.arange(dim // 2, device=positions.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / dim))
    angles = positions.to(torch.float32)[:, :, None, None, None] * freqs
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope_(x: torch.Tensor, rotation: torch.Tensor) -> None:
    """In place: the rotary embedding of ``x`` ``[B, T, parts, H, D]``, (real, imag) pairs interleaved, computed
    in fp32 (queries and keys in one go: one cast, one product and one copy back for both)."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    if x.dtype == torch.float32:
        pairs.mul_(rotation)  # pairs is a view of x
    else:
        x.copy_(torch.view_as_real(pairs * rotation).flatten(-2))
