"""Run Kyutai's ``moshi`` 0.2.13 the way the oracle tests need it.

Everything here drives moshi's own modules; the only thing added is
:func:`attention_window`, which reproduces the one behaviour in which NVIDIA's
PersonaPlex fork differs from moshi 0.2.13 on the paths we test:

* **moshi 0.2.13** (``"kyutai"``): a streaming attention with ``context`` C
  sees the last C keys (its ``RingKVCache`` labels every ring slot with its true
  position).
* **PersonaPlex fork** (``"fork"``): the ring slot ``end_offset % C`` (the
  oldest key once the ring is full) is labelled with position ``end_offset``,
  so it is masked as a future key: a query sees keys
  ``[max(0, E - C + 1), p]`` for a chunk ending at ``E - 1`` (golden README,
  "Traps").

With the ``"fork"`` window, moshi 0.2.13 reproduces the golden set's streaming
Mimi codes exactly and its decoded audio to ~2e-7
(``test_fork_window_reproduces_golden_mimi``), so the patch is checked against
the fork's own output.

Depformer caches (``respect_exec_mask=False``: one per frame, never wrapping in
a way that reaches an output we compare) are left alone.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import typing as tp

# moshi wraps a few functions in torch.compile, which on CPU only slows the
# first call by tens of seconds; eager is the reference we want.  Must be set
# before moshi is imported.
os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import _tiny_moshi as tiny  # noqa: E402

if tp.TYPE_CHECKING:  # pragma: no cover
    from moshi.models.compression import MimiModel
    from moshi.models.lm import LMModel

WINDOW_RULES = ("kyutai", "fork")


@contextlib.contextmanager
def attention_window(rule: str) -> tp.Iterator[None]:
    """Make moshi's streaming attention follow ``rule`` for the duration."""
    from moshi.modules import transformer as tr

    if rule not in WINDOW_RULES:
        raise ValueError(f"unknown attention window rule {rule!r}; use one of {WINDOW_RULES}")
    if rule == "kyutai":
        yield
        return
    original = tr.RingKVCache.complete

    def complete(self: tr.RingKVCache, k: torch.Tensor, v: torch.Tensor, exec_mask: torch.Tensor) -> tr.KVCacheResult:
        result = original(self, k, v, exec_mask)
        if not self.respect_exec_mask:
            return result
        slots = torch.arange(self.capacity, device=self.end_offset.device)
        end = self.end_offset.view(-1, 1)  # already advanced past this chunk
        positions = torch.where(slots == end % self.capacity, end, result.positions)
        return tr.KVCacheResult(result.keys, result.values, positions)

    tr.RingKVCache.complete = complete  # type: ignore[method-assign]
    try:
        yield
    finally:
        tr.RingKVCache.complete = original  # type: ignore[method-assign]


def window_rule_for(config: dict) -> str:
    """Which reference a checkpoint follows: PersonaPlex's fork or Kyutai's moshi."""
    return "fork" if "personaplex" in config else "kyutai"


# --------------------------------------------------------------------------- Mimi


def _mask(rows: tp.Iterable[int], batch: int) -> torch.Tensor:
    mask = torch.zeros(batch, dtype=torch.bool)
    mask[list(rows)] = True
    return mask


@torch.no_grad()
def mimi_encode(
    mimi: MimiModel,
    pcm: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    rule: str = "kyutai",
) -> np.ndarray:
    """Streaming encode of ``pcm`` ``[B, T, 1920]`` -> codes ``[B, T, K]``.

    ``resets[t]`` lists rows whose streams restart (``reset_streaming(mask)``)
    just before frame ``t``.
    """
    resets = resets or {}
    batch, steps, _ = pcm.shape
    out = []
    with attention_window(rule), mimi.streaming(batch):
        for t in range(steps):
            if t in resets:
                mimi.reset_streaming(_mask(resets[t], batch))
            frame = torch.from_numpy(np.ascontiguousarray(pcm[:, t], dtype=np.float32))[:, None]
            out.append(mimi.encode(frame)[:, :, 0].numpy())
    return np.stack(out, axis=1)


@torch.no_grad()
def mimi_decode(
    mimi: MimiModel,
    codes: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    rule: str = "kyutai",
) -> np.ndarray:
    """Streaming decode of ``codes`` ``[B, T, K]`` -> pcm ``[B, T, 1920]``."""
    resets = resets or {}
    batch, steps, _ = codes.shape
    out = []
    with attention_window(rule), mimi.streaming(batch):
        for t in range(steps):
            if t in resets:
                mimi.reset_streaming(_mask(resets[t], batch))
            frame = torch.from_numpy(np.ascontiguousarray(codes[:, t], dtype=np.int64))[:, :, None]
            out.append(mimi.decode(frame)[:, 0].numpy())
    return np.stack(out, axis=1)


# --------------------------------------------------------------------------- LM


def load_oracle_lm(directory: pathlib.Path) -> LMModel:
    """A moshi LM whose greedy text + agent audio are the checkpoint's reference.

    A Kyutai checkpoint (dep_q 8) loads as it is.  A PersonaPlex-style one
    (dep_q 16) is reloaded as dep_q 8 from its first 8 depformer steps: see
    :func:`_tiny_moshi.truncate_depformer` for why that is exact.  Loading is
    strict in both cases.
    """
    from moshi.models import loaders
    from safetensors.torch import load_file

    config = tiny.read_config(directory)
    if config["dep_q"] == 8:
        return tiny.load_moshi_lm(directory)
    assert config["dep_q"] == 16, config["dep_q"]
    state = load_file(str(directory / config["moshi_name"]))
    state = tiny.truncate_depformer(state, 16, 8)
    kw = tiny.config_lm_kwargs(config) | {"dep_q": 8}
    lm = loaders.get_moshi_lm(None, lm_kwargs=kw, device="cpu", dtype=torch.float32)
    lm.load_state_dict(state, strict=True)
    return lm.eval()


@torch.no_grad()
def lm_generate(
    lm: LMModel,
    user_codes: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None = None,
    rule: str = "kyutai",
) -> np.ndarray:
    """Greedy ``LMGen`` run: user codes ``[B, T, 8]`` -> ``[B, T, 9]`` (text + agent audio).

    ``support_out_of_sync=True`` so that every step returns a tensor; rows
    still warming up (the first ``max_delay`` steps of a stream) hold ``-2``.
    ``resets[t]``: rows reset (``reset_streaming(mask)``) before step ``t``;
    ``exec_masks[t]``: the exec mask for step ``t`` (``set_exec_mask``),
    all-true otherwise.
    """
    from moshi.models.lm import LMGen

    resets = resets or {}
    exec_masks = exec_masks or {}
    batch, steps, _ = user_codes.shape
    gen = LMGen(lm, use_sampling=False, support_out_of_sync=True)
    out = []
    all_on = torch.ones(batch, dtype=torch.bool)
    with attention_window(rule), gen.streaming(batch):
        for t in range(steps):
            if t in resets:
                gen.reset_streaming(_mask(resets[t], batch))
            gen.set_exec_mask(torch.tensor(exec_masks[t], dtype=torch.bool) if t in exec_masks else all_on)
            codes = torch.from_numpy(np.ascontiguousarray(user_codes[:, t], dtype=np.int64))[:, :, None]
            tokens = gen.step(codes)
            assert tokens is not None  # support_out_of_sync: never None
            out.append(tokens[:, : 1 + 8, 0].numpy())
    return np.stack(out, axis=1)
