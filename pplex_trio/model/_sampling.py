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
from ._streaming import reset_rows_


@dataclasses.dataclass
class RowChoice:
    """One kind of token's sampling settings per row, as :func:`choose` uses them.

    The rows that take the argmax (greedy, or a temperature <= 0) get a
    temperature of 1, no top-k and no noise (:meth:`gumbel`): their score is
    their logits, so every row goes through the same few operations.
    """

    temperature: torch.Tensor  # [B, 1] float32, > 0
    kth: torch.Tensor  # [B, 1] long: where the top-k threshold is in the descending order
    argmax: torch.Tensor  # [B] bool
    vocab: int

    @classmethod
    def of(cls, temperature: torch.Tensor, topk: torch.Tensor, greedy: torch.Tensor, vocab: int) -> RowChoice:
        """From per-row ``temperature`` [B] float32, ``topk`` [B] long (<= 0: none) and ``greedy`` [B] bool."""
        argmax = greedy | (temperature <= 0)
        k = torch.where((topk <= 0) | (topk > vocab) | argmax, torch.full_like(topk, vocab), topk)
        temperature = torch.where(argmax, torch.ones_like(temperature), temperature.clamp(min=1e-6))
        return cls(temperature[:, None], (k - 1)[:, None], argmax, vocab)

    def set_row(self, row: int, temperature: float, topk: int, greedy: bool) -> None:
        """Row ``row``'s settings, in place (between steps)."""
        one = RowChoice.of(
            torch.tensor([temperature], dtype=torch.float32),
            torch.tensor([topk]),
            torch.tensor([greedy]),
            vocab=self.vocab,
        )
        for mine, new in ((self.temperature, one.temperature), (self.kth, one.kth), (self.argmax, one.argmax)):
            mine[row] = new[0]

    def gumbel(self, noise: torch.Tensor) -> torch.Tensor:
        """``log E`` of ``Exp(1)`` ``noise`` ``[B, ...]``, zero on the argmax rows."""
        return torch.where(self.argmax.view(-1, *([1] * (noise.dim() - 1))), 0.0, noise.log())


def choose(logits: torch.Tensor, choice: RowChoice, gumbel: torch.Tensor) -> torch.Tensor:
    """One token per row from ``logits`` ``[B, V]``: ``argmax(logits / T - log E)`` over the top k, with
    ``gumbel`` = ``choice.gumbel(E)`` of the same shape."""
    scaled = logits / choice.temperature  # in float32, the temperature's dtype
    kth = scaled.sort(dim=-1, descending=True).values.gather(1, choice.kth)
    return (scaled - gumbel).masked_fill(scaled < kth, float("-inf")).argmax(dim=-1)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    topk: torch.Tensor,
    greedy: torch.Tensor,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """One token per row from ``logits`` ``[B, V]``; ``noise`` is ``Exp(1)`` of the same shape.

    Rows that are greedy, or have a temperature <= 0, take the argmax (as
    does every row when ``noise`` is None).
    """
    if noise is None:
        return logits.argmax(dim=-1)
    choice = RowChoice.of(temperature, topk, greedy, logits.shape[-1])
    return choose(logits, choice, choice.gumbel(noise))


@dataclasses.dataclass
class RowSampling:
    """Per-row sampling settings as device tensors, text and audio each ready for :func:`choose`
    (see :meth:`set_row`)."""

    text: RowChoice
    audio: RowChoice

    @classmethod
    def greedy_rows(cls, batch_size: int, text_card: int, card: int, device: torch.device | str) -> RowSampling:
        """Settings for ``batch_size`` rows that all pick the argmax, on ``device``."""

        def greedy(vocab: int) -> RowChoice:
            zero = torch.zeros(batch_size, device=device)
            return RowChoice.of(zero, zero.long(), torch.ones(batch_size, dtype=torch.bool, device=device), vocab)

        return cls(greedy(text_card), greedy(card))

    def set_greedy(self) -> None:
        """Every row greedy (as after :meth:`greedy_rows`), in place."""
        for choice in (self.text, self.audio):
            choice.temperature.fill_(1.0)
            choice.kth.fill_(choice.vocab - 1)
            choice.argmax.fill_(True)

    def set_row(self, row: int, sampling: Sampling) -> None:
        """Set row ``row``'s text and audio settings from a conversation's :class:`Sampling`, in place."""
        self.text.set_row(row, sampling.text_temperature, sampling.text_topk, sampling.greedy)
        self.audio.set_row(row, sampling.audio_temperature, sampling.audio_topk, sampling.greedy)


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
        self._index = torch.cat(
            [torch.arange(text_card, device=self.device), torch.arange(num_audio * card, device=self.device)]
        )
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

    def reset(self, mask: torch.Tensor) -> None:
        """Rows in ``mask`` (bool ``[B]``) back to a zero seed at step 0, in place; the others untouched."""
        reset_rows_(self.seeds, mask, 0)
        reset_rows_(self.bases, mask, 0)  # the hash of a zero seed
        reset_rows_(self.steps, mask, 0)

    def draw(self, advance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(text [B, text_card], audio [B, num_audio, card])`` noise of each row's current step (views of one
        tensor).  Then the rows in ``advance`` (bool ``[B]``) move on to their next step.
        """
        keys = mix32((self.bases + self.steps[:, None]) & _LOW32)  # [B, 2]: text, audio
        noise = exponential_noise(keys[:, self._column], self._index)
        self.steps.add_(advance)
        text_card, num_audio, card = self._shapes
        return noise[:, :text_card], noise[:, text_card:].view(-1, num_audio, card)
