"""Causal streaming 1-D convolutions, the building blocks of Mimi.

A causal conv with kernel ``k`` (dilated) and stride ``s`` needs the last
``k - s`` input samples of the previous chunk: the state keeps them per
row.  Before the first chunk that memory is zeros (``pad_mode="constant"``)
or copies of the first sample (``"replicate"``, used by Mimi's 25 -> 12.5 Hz
downsampling conv).  A transposed conv keeps the overlap-add tail of its
output (``k - s`` samples) and adds it to the next chunk.  Fed whole
frames, the streaming output equals the one-shot causal output.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Generic, TypeVar

import torch
from torch import nn

from ._streaming import reset_rows_, set_rows_, where_rows

M = TypeVar("M", bound=nn.Module)


class Named(nn.Module, Generic[M]):
    """A one-child wrapper; it exists so parameter names match the checkpoints.

    Kyutai nests its convs (``conv.conv.weight``, ``convtr.convtr.weight``);
    we keep the same path instead of renaming keys at load time.  For the type
    checker, any attribute a ``Named[M]`` does not have as a module is its child.
    """

    def __init__(self, name: str, child: M):
        super().__init__()
        self.add_module(name, child)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> M: ...


@dataclasses.dataclass
class ConvState:
    """Per-row memory of a :class:`StreamingConv1d`: the input tail carried over to the next chunk."""

    previous: torch.Tensor  # [B, C_in, k - s]: input tail of the last chunk
    first: torch.Tensor  # [B] bool: no chunk seen yet (for replicate padding)

    def reset(self, mask: torch.Tensor) -> None:
        """Put the rows selected by ``mask`` [B] back to fresh (zero tail, no chunk seen), in place."""
        reset_rows_(self.previous, mask, 0.0)
        reset_rows_(self.first, mask, True)


@dataclasses.dataclass
class ConvTrState:
    """Per-row memory of a :class:`StreamingConvTranspose1d`: the overlap-add tail not yet emitted."""

    partial: torch.Tensor  # [B, C_out, k - s]: overlap-add tail, bias excluded

    def reset(self, mask: torch.Tensor) -> None:
        """Zero the overlap-add tail of the rows selected by ``mask`` [B], in place."""
        reset_rows_(self.partial, mask, 0.0)


class StreamingConv1d(nn.Module):
    """Causal 1-D conv fed chunk by chunk (see the module docstring); pad mode ``constant`` or ``replicate``."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ):
        super().__init__()
        if pad_mode not in ("constant", "replicate"):
            raise ValueError(f"unsupported pad_mode {pad_mode!r}")
        self.conv = Named(
            "conv",
            nn.Conv1d(in_channels, out_channels, kernel_size, stride, dilation=dilation, groups=groups, bias=bias),
        )
        self.stride = stride
        self.pad_mode = pad_mode
        self.memory = (kernel_size - 1) * dilation + 1 - stride

    def init_state(self, batch_size: int) -> ConvState:
        """A fresh state for ``batch_size`` rows, on the weights' device and dtype."""
        w = self.conv.conv.weight
        return ConvState(
            previous=torch.zeros(
                batch_size, w.shape[1] * self.conv.conv.groups, self.memory, device=w.device, dtype=w.dtype
            ),
            first=torch.ones(batch_size, device=w.device, dtype=torch.bool),
        )

    def forward(self, x: torch.Tensor, state: ConvState, exec_mask: torch.Tensor) -> torch.Tensor:
        """``[B, C_in, T]`` -> ``[B, C_out, T / stride]``; T must be a multiple of the stride (else ``ValueError``).
        Only the rows of ``exec_mask`` [B] move their state.
        """
        if x.shape[-1] % self.stride:
            raise ValueError(f"chunk of {x.shape[-1]} samples is not a multiple of the stride {self.stride}")
        if self.memory == 0:
            return self.conv.conv(x)
        previous = state.previous
        if self.pad_mode == "replicate":
            previous = where_rows(state.first, x[..., :1].expand_as(previous), previous)
            state.first.logical_and_(~exec_mask)
        x = torch.cat([previous, x], dim=-1)
        y = self.conv.conv(x)
        set_rows_(state.previous, exec_mask, x[..., -self.memory :])
        return y


class StreamingConvTranspose1d(nn.Module):
    """Streaming transposed conv (upsampling); needs ``stride < kernel_size <= 2 * stride`` (else ``ValueError``)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1, bias: bool = True
    ):
        super().__init__()
        if not stride < kernel_size <= 2 * stride:
            raise ValueError("a streaming transposed conv needs stride < kernel_size <= 2 * stride")
        self.convtr = Named(
            "convtr", nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride, groups=groups, bias=bias)
        )
        self.tail = kernel_size - stride

    def init_state(self, batch_size: int) -> ConvTrState:
        """A fresh (zero-tail) state for ``batch_size`` rows, on the weights' device and dtype."""
        w = self.convtr.convtr.weight
        out_channels = w.shape[1] * self.convtr.convtr.groups
        return ConvTrState(torch.zeros(batch_size, out_channels, self.tail, device=w.device, dtype=w.dtype))

    def forward(self, x: torch.Tensor, state: ConvTrState, exec_mask: torch.Tensor) -> torch.Tensor:
        """``[B, C_in, T]`` -> ``[B, C_out, T * stride]``, the previous chunk's tail added; only the rows of
        ``exec_mask`` [B] keep the new tail.
        """
        conv = self.convtr.convtr
        y = conv(x)
        out = y[..., : -self.tail].clone()
        out[..., : self.tail].add_(state.partial)
        tail = y[..., -self.tail :]
        if conv.bias is not None:
            tail = tail - conv.bias[:, None]  # the next chunk adds its own bias
        set_rows_(state.partial, exec_mask, tail)
        return out
