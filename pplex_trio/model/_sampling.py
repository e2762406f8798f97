"""Per-row sampling: temperature, top-k, seeds, greedy.

Every row (conversation slot) has its own settings and its own two seeds
(text and audio), from its ``Sampling``, so a
conversation's tokens depend only on its own seed and inputs, never on what
the other rows do or on how long its prompt took.

Sampling from ``softmax(logits / T)`` restricted to the top ``k`` is done
with the exponential race (Gumbel-max): ``argmax(logits / T - log E)`` with
``E ~ Exp(1)`` per vocabulary entry.  ``E`` comes from a counter-based hash
of the row's seed, its step and the entry (:class:`RowNoise`), computed on
the device: the whole of a step's sampling is a handful of tensor ops with
no host round trip and no per-row launch, so it lives inside the tick's
CUDA graph.
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

    def set_greedy(self) -> None:
        """Every row greedy (as after :meth:`greedy_rows`), in place."""
        for t in (self.text_temperature, self.audio_temperature, self.text_topk, self.audio_topk):
            t.zero_()
        self.greedy.fill_(True)

    def set_row(self, row: int, sampling: Sampling) -> None:
        self.text_temperature[row] = sampling.text_temperature
        self.text_topk[row] = sampling.text_topk
        self.audio_temperature[row] = sampling.audio_temperature
        self.audio_topk[row] = sampling.audio_topk
        self.greedy[row] = sampling.greedy


@dataclasses.dataclass
class RowChoice:
    """One kind of token's sampling settings, per row, in the form :func:`choose` uses (made once per step)."""

    temperature: torch.Tensor  # [B, 1] float, > 0
    kth: torch.Tensor  # [B, 1] long: where the top-k threshold is in the descending order
    argmax: torch.Tensor  # [B] bool: the rows that take the argmax (greedy, or a temperature <= 0)

    @classmethod
    def of(cls, temperature: torch.Tensor, topk: torch.Tensor, greedy: torch.Tensor, vocab: int) -> "RowChoice":
        k = torch.where((topk <= 0) | (topk > vocab), torch.full_like(topk, vocab), topk)
        return cls(temperature.clamp(min=1e-6)[:, None], (k - 1)[:, None], greedy | (temperature <= 0))


def choose(logits: torch.Tensor, choice: RowChoice, noise: torch.Tensor) -> torch.Tensor:
    """One token per row from ``logits`` ``[B, V]`` and ``Exp(1)`` ``noise`` of the same shape."""
    best = logits.argmax(dim=-1)
    scaled = logits / choice.temperature  # in float32, the temperature's dtype
    kth = scaled.sort(dim=-1, descending=True).values.gather(1, choice.kth)
    score = (scaled - noise.log()).masked_fill(scaled < kth, float("-inf"))
    return torch.where(choice.argmax, best, score.argmax(dim=-1))


def sample(logits: torch.Tensor, temperature: torch.Tensor, topk: torch.Tensor, greedy: torch.Tensor,
           noise: torch.Tensor | None) -> torch.Tensor:
    """One token per row from ``logits`` ``[B, V]``; ``noise`` is ``Exp(1)`` of the same shape.

    Rows that are greedy, or have a temperature <= 0, take the argmax (as
    does every row when ``noise`` is None).
    """
    if noise is None:
        return logits.argmax(dim=-1)
    return choose(logits, RowChoice.of(temperature, topk, greedy, logits.shape[-1]), noise)


_LOW32 = 0xFFFF_FFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for ``x`` in ``[0, 2**32)`` (int64), by the halves of ``c`` so no product overflows
    63 bits: ``x * c = x * low + (x * high) * 2**16``, where only the low 16 bits of ``x * high`` matter."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _LOW32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser (a bijection of ``[0, 2**32)`` with full avalanche), on int64 tensors."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EB_CA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2_AE35)
    return x ^ (x >> 16)


def exponential_noise(key: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``Exp(1)`` noise, float32, a pure function of a key and an element index (broadcast together).

    ``u = (top 24 bits of mix32(mix32(index ^ key) + key) + 0.5) / 2**24`` lies strictly inside ``(0, 1)``,
    so ``-log(u)`` is finite (at most ~17.3).
    """
    bits = mix32((mix32(index ^ key) + key) & _LOW32)
    return -torch.log(((bits >> 8).to(torch.float32) + 0.5) * (1.0 / 2**24))


class RowNoise:
    """The sampling noise of every row, computed on the device from per-row seeds and step counters.

    A row's noise at its ``n``-th sampled step depends only on its seeds and
    ``n``: never on the other rows, the batch position or the time its
    prompt took.  No generator objects and no per-row launches: one
    :meth:`draw` is a few elementwise kernels over the whole batch, text and
    audio together, which a CUDA graph records like any other part of the
    tick (the counters advance on the device).
    """

    def __init__(self, batch_size: int, text_card: int, num_audio: int, card: int, device: torch.device | str):
        self.device = torch.device(device)
        self.seeds = torch.zeros(batch_size, 2, dtype=torch.long, device=self.device)  # text, audio
        self.bases = torch.zeros_like(self.seeds)  # each seed's hash: the part of a step's key that never changes
        self.steps = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self._shapes = (text_card, num_audio, card)
        self._index = torch.cat([torch.arange(text_card, device=self.device),
                                 torch.arange(num_audio * card, device=self.device)])
        self._column = torch.zeros_like(self._index)  # each entry's seed: text 0, audio 1
        self._column[text_card:] = 1

    def seed(self, row: int, text_seed: int | None, audio_seed: int | None) -> tuple[int, int]:
        """Seed row ``row`` and restart its counter; ``None`` picks a random seed.  Returns the seeds used."""
        text_seed = secrets.randbits(63) if text_seed is None else text_seed
        audio_seed = secrets.randbits(63) if audio_seed is None else audio_seed
        seed = torch.tensor([text_seed % 2**63, audio_seed % 2**63], device=self.device)
        self.seeds[row] = seed
        self.bases[row] = mix32(mix32(seed & _LOW32) ^ (seed >> 32))
        self.steps[row] = 0
        return text_seed, audio_seed

    def reset(self) -> None:
        self.seeds.zero_()
        self.bases.zero_()  # the hash of a zero seed
        self.steps.zero_()

    def draw(self, advance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(text [B, text_card], audio [B, num_audio, card])`` noise of each row's current step (views of one
        tensor).  Then the rows in ``advance`` (bool ``[B]``) move on to their next step.
        """
        keys = mix32((self.bases + self.steps[:, None]) & _LOW32)  # [B, 2]: text, audio
        noise = exponential_noise(keys[:, self._column], self._index)
        self.steps.add_(advance)
        text_card, num_audio, card = self._shapes
        return noise[:, :text_card], noise[:, text_card:].view(-1, num_audio, card)
