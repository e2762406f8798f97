"""Per-row sampling: temperature, top-k, seeded generators, greedy.

Every row (conversation slot) has its own settings and its own two random
generators (text and audio), seeded from its ``Sampling`` seeds, so a
conversation's tokens depend only on its own seed and inputs, never on what
the other rows do or on how long its prompt took.

Sampling from ``softmax(logits / T)`` restricted to the top ``k`` is done
with the exponential race (Gumbel-max): ``argmax(logits / T - log E)`` with
``E ~ Exp(1)`` drawn per vocabulary entry.  All randomness of one step is
drawn up front (one call per live row), so the batched sampling itself is a
handful of tensor ops with no host round trip.
"""

from __future__ import annotations

import dataclasses
import secrets

import torch

from .._conversation import Sampling


@dataclasses.dataclass
class RowSampling:
    """Per-row sampling settings as device tensors (see :meth:`set_row`)."""

    text_temperature: torch.Tensor  # [B] float
    text_topk: torch.Tensor  # [B] long (<= 0: no top-k)
    audio_temperature: torch.Tensor  # [B] float
    audio_topk: torch.Tensor  # [B] long
    greedy: torch.Tensor  # [B] bool

    @classmethod
    def greedy_rows(cls, batch_size: int, device: torch.device | str) -> "RowSampling":
        f = lambda v: torch.full((batch_size,), v, device=device)  # noqa: E731
        return cls(f(0.0), f(0).long(), f(0.0), f(0).long(), f(True).bool())

    def set_row(self, row: int, sampling: Sampling) -> None:
        self.text_temperature[row] = sampling.text_temperature
        self.text_topk[row] = sampling.text_topk
        self.audio_temperature[row] = sampling.audio_temperature
        self.audio_topk[row] = sampling.audio_topk
        self.greedy[row] = sampling.greedy


def sample(logits: torch.Tensor, temperature: torch.Tensor, topk: torch.Tensor, greedy: torch.Tensor,
           noise: torch.Tensor | None) -> torch.Tensor:
    """One token per row from ``logits`` ``[B, V]``; ``noise`` is ``Exp(1)`` of the same shape.

    Rows that are greedy, or have a temperature <= 0, take the argmax (as
    does every row when ``noise`` is None).
    """
    best = logits.argmax(dim=-1)
    if noise is None:
        return best
    vocab = logits.shape[-1]
    scaled = logits.float() / temperature.clamp(min=1e-6)[:, None]
    k = torch.where((topk <= 0) | (topk > vocab), torch.full_like(topk, vocab), topk)
    kth = scaled.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
    score = (scaled - noise.log()).masked_fill(scaled < kth, float("-inf"))
    drawn = score.argmax(dim=-1)
    return torch.where(greedy | (temperature <= 0), best, drawn)


class RowGenerators:
    """Two seeded generators per row and preallocated noise buffers."""

    def __init__(self, batch_size: int, text_card: int, num_audio: int, card: int, device: torch.device | str):
        self.device = torch.device(device)
        self.text = [torch.Generator(device=self.device) for _ in range(batch_size)]
        self.audio = [torch.Generator(device=self.device) for _ in range(batch_size)]
        self.text_noise = torch.ones(batch_size, text_card, device=self.device)
        self.audio_noise = torch.ones(batch_size, num_audio, card, device=self.device)

    def seed(self, row: int, text_seed: int | None, audio_seed: int | None) -> tuple[int, int]:
        """Seed row ``row``; ``None`` picks a random seed.  Returns the seeds used."""
        text_seed = secrets.randbits(63) if text_seed is None else text_seed
        audio_seed = secrets.randbits(63) if audio_seed is None else audio_seed
        self.text[row].manual_seed(text_seed)
        self.audio[row].manual_seed(audio_seed)
        return text_seed, audio_seed

    def draw(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh noise for ``rows`` (the others keep stale values, which nobody reads)."""
        for row in rows:
            self.text_noise[row].exponential_(generator=self.text[row])
            self.audio_noise[row].exponential_(generator=self.audio[row])
        return self.text_noise, self.audio_noise
