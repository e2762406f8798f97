"""Mimi's SEANet encoder and decoder, streaming.

The layer lists (and so the ``model.{i}`` indices of the checkpoint keys)
follow Kyutai's layout: ELU activations are modules of their own and take
an index.  Encoder: conv, then per ratio (smallest first) residual blocks,
ELU and a strided conv that doubles the channels; then ELU and the last
conv.  The decoder mirrors it with transposed convs.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ._config import SEANetConfig
from ._conv import StreamingConv1d, StreamingConvTranspose1d
from ._streaming import StreamingState


@runtime_checkable
class _Stateful(Protocol):
    """A layer with streaming state (a conv or a residual block); isinstance checks for ``init_state``."""

    def init_state(self, batch_size: int) -> StreamingState: ...


def _init_states(modules: nn.Sequential, batch_size: int) -> list[StreamingState | None]:
    return [m.init_state(batch_size) if isinstance(m, _Stateful) else None for m in modules]


def _run(modules: nn.Sequential, states: list, x: torch.Tensor, exec_mask: torch.Tensor) -> torch.Tensor:
    for module, state in zip(modules, states):
        x = module(x) if state is None else module(x, state, exec_mask)
    return x


class StateList(list):
    """The states of a sequence of layers (``None`` for stateless ones)."""

    def reset(self, mask: torch.Tensor) -> None:
        """Put the rows selected by ``mask`` [B] back to fresh in every layer that has a state, in place."""
        for state in self:
            if state is not None:
                state.reset(mask)


class ResidualBlock(nn.Module):
    """SEANet's residual unit: ELU, dilated conv, ELU, 1x1 conv, added to the input (or to a 1x1 conv of it)."""

    def __init__(self, dim: int, cfg: SEANetConfig, dilation: int):
        super().__init__()
        hidden = dim // cfg.compress
        self.block = nn.Sequential(
            nn.ELU(),
            StreamingConv1d(dim, hidden, cfg.residual_kernel_size, dilation=dilation, pad_mode=cfg.pad_mode),
            nn.ELU(),
            StreamingConv1d(hidden, dim, 1, pad_mode=cfg.pad_mode),
        )
        if not cfg.true_skip:
            self.shortcut = StreamingConv1d(dim, dim, 1, pad_mode=cfg.pad_mode)

    def init_state(self, batch_size: int) -> StateList:
        """Fresh states of the block's convs for ``batch_size`` rows."""
        return StateList(_init_states(self.block, batch_size))

    def forward(self, x: torch.Tensor, state: StateList, exec_mask: torch.Tensor) -> torch.Tensor:
        """``[B, dim, T]`` -> ``[B, dim, T]``; only the rows of ``exec_mask`` [B] move their state."""
        skip = x if not hasattr(self, "shortcut") else self.shortcut(x, None, exec_mask)
        return skip + _run(self.block, state, x, exec_mask)


class SEANetEncoder(nn.Module):
    """``[B, channels, T]`` audio to ``[B, dimension, T / hop]`` latents."""

    def __init__(self, cfg: SEANetConfig):
        super().__init__()
        nf = cfg.n_filters
        layers: list[nn.Module] = [StreamingConv1d(cfg.channels, nf, cfg.kernel_size, pad_mode=cfg.pad_mode)]
        mult = 1
        for ratio in reversed(cfg.ratios):
            for j in range(cfg.n_residual_layers):
                layers.append(ResidualBlock(mult * nf, cfg, cfg.dilation_base**j))
            layers += [
                nn.ELU(),
                StreamingConv1d(mult * nf, 2 * mult * nf, 2 * ratio, stride=ratio, pad_mode=cfg.pad_mode),
            ]
            mult *= 2
        layers += [nn.ELU(), StreamingConv1d(mult * nf, cfg.dimension, cfg.last_kernel_size, pad_mode=cfg.pad_mode)]
        self.model = nn.Sequential(*layers)

    def init_state(self, batch_size: int) -> StateList:
        """Fresh states of every layer for ``batch_size`` rows (``None`` for stateless ones)."""
        return StateList(_init_states(self.model, batch_size))

    def forward(self, x: torch.Tensor, state: StateList, exec_mask: torch.Tensor) -> torch.Tensor:
        """``[B, channels, T]`` -> ``[B, dimension, T / hop]``, T a multiple of the hop; only the rows of ``exec_mask``
        [B] move their state.
        """
        return _run(self.model, state, x, exec_mask)


class SEANetDecoder(nn.Module):
    """``[B, dimension, T]`` latents to ``[B, channels, T * hop]`` audio."""

    def __init__(self, cfg: SEANetConfig):
        super().__init__()
        nf = cfg.n_filters
        mult = 2 ** len(cfg.ratios)
        layers: list[nn.Module] = [StreamingConv1d(cfg.dimension, mult * nf, cfg.kernel_size, pad_mode=cfg.pad_mode)]
        for ratio in cfg.ratios:
            layers += [nn.ELU(), StreamingConvTranspose1d(mult * nf, mult * nf // 2, 2 * ratio, stride=ratio)]
            for j in range(cfg.n_residual_layers):
                layers.append(ResidualBlock(mult * nf // 2, cfg, cfg.dilation_base**j))
            mult //= 2
        layers += [nn.ELU(), StreamingConv1d(nf, cfg.channels, cfg.last_kernel_size, pad_mode=cfg.pad_mode)]
        self.model = nn.Sequential(*layers)

    def init_state(self, batch_size: int) -> StateList:
        """Fresh states of every layer for ``batch_size`` rows (``None`` for stateless ones)."""
        return StateList(_init_states(self.model, batch_size))

    def forward(self, x: torch.Tensor, state: StateList, exec_mask: torch.Tensor) -> torch.Tensor:
        """``[B, dimension, T]`` -> ``[B, channels, T * hop]``; only the rows of ``exec_mask`` [B] move their state."""
        return _run(self.model, state, x, exec_mask)
