"""Run Kyutai's ``moshi`` 0.2.13 the way the oracle tests need it.

Everything here drives moshi's own modules.  Kyutai's checkpoints are
compared with moshi 0.2.13 as published (:data:`KYUTAI`).  For
PersonaPlex-style checkpoints our implementation follows NVIDIA's
PersonaPlex fork (the reference of the golden set) where that fork differs
from moshi 0.2.13 on the paths we test; :class:`Semantics` switches each
difference on top of moshi (:data:`FORK`), so that moshi checks our code
paths under the reference each checkpoint declares
(:func:`checkpoint_semantics`):

* **Attention window** (:func:`attention_window`).  moshi 0.2.13: a
  streaming attention of ``context`` C sees the last C keys (its
  ``RingKVCache`` labels every slot with its true position).  Fork: the slot
  ``end_offset % C`` (the oldest key once the ring is full) is labelled with
  position ``end_offset``, so it is masked as a future key and a query sees
  keys ``[max(0, E - C + 1), p]`` for a chunk ending at ``E - 1``.  The fork
  does this in the temporal transformer, Mimi's transformers and the
  depformer (whose ring has ``dep_q`` slots, so its last step does not see
  step 0); the depformer can be switched separately.  Checked against the
  golden set by ``test_fork_window_reproduces_golden_mimi``.
* **User-audio timing** (``user_lag``).  moshi 0.2.13 feeds the user frame
  given at call ``n`` (its undelayed semantic codebook) into the temporal
  transformer at call ``n`` itself; the fork writes it as that call's target
  and feeds it one call later.  moshi with every row's user frames delayed by
  one executed call imitates that.

:data:`KYUTAI` (nothing switched) is Kyutai's reference as published.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import typing as tp

# moshi wraps a few functions in torch.compile, which on CPU only slows the
# first call by tens of seconds; eager is the reference we want.  Must be set
# before moshi is imported.
os.environ.setdefault("NO_TORCH_COMPILE", "1")

import _tiny_moshi as tiny  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

if tp.TYPE_CHECKING:  # pragma: no cover
    from moshi.models.compression import MimiModel
    from moshi.models.lm import LMModel

WINDOW_RULES = ("kyutai", "fork")


@dataclasses.dataclass(frozen=True)
class Semantics:
    """Which reference moshi imitates: attention windows and user-audio timing."""

    window: str = "kyutai"  # temporal transformer and Mimi's transformers
    depformer_window: str = "kyutai"
    user_lag: int = 0  # executed calls between giving a user frame and the model reading it

    def __post_init__(self) -> None:
        if {self.window, self.depformer_window} - set(WINDOW_RULES) or self.user_lag not in (0, 1):
            raise ValueError(f"bad semantics {self}")


KYUTAI = Semantics()
"""moshi 0.2.13 as published: Kyutai's reference for Kyutai checkpoints."""

FORK = Semantics(window="fork", depformer_window="kyutai", user_lag=1)
"""NVIDIA's fork where our PersonaPlex mode follows it: LM/Mimi windows and user timing (not the depformer)."""


def checkpoint_semantics(directory: pathlib.Path) -> Semantics:
    """The reference a tiny checkpoint must follow, from what it is: PersonaPlex-style or Kyutai's own.

    Stated here independently of our loader: a ``personaplex`` object in
    ``config.json`` means NVIDIA's fork (:data:`FORK`), none means Kyutai's
    moshi 0.2.13 as published (:data:`KYUTAI`).
    """
    return FORK if "personaplex" in tiny.read_config(directory) else KYUTAI


@contextlib.contextmanager
def attention_window(rule: str, depformer_rule: str | None = None) -> tp.Iterator[None]:
    """Make moshi's streaming attentions follow ``rule`` (``depformer_rule`` for the depformer)."""
    from moshi.modules import transformer as tr

    depformer_rule = rule if depformer_rule is None else depformer_rule
    if {rule, depformer_rule} - set(WINDOW_RULES):
        raise ValueError(f"unknown attention window rule {rule!r}/{depformer_rule!r}; use {WINDOW_RULES}")
    if rule == depformer_rule == "kyutai":
        yield
        return
    original = tr.RingKVCache.complete

    def complete(self: tr.RingKVCache, k: torch.Tensor, v: torch.Tensor, exec_mask: torch.Tensor) -> tr.KVCacheResult:
        result = original(self, k, v, exec_mask)
        # Depformer caches are the ones that ignore the exec mask (weights_per_step).
        if (rule if self.respect_exec_mask else depformer_rule) == "kyutai":
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


# --------------------------------------------------------------------------- Mimi


def _mask(rows: tp.Iterable[int], batch: int) -> torch.Tensor:
    mask = torch.zeros(batch, dtype=torch.bool)
    mask[list(rows)] = True
    return mask


@torch.no_grad()
def _mimi_stream(
    mimi: MimiModel,
    fn: tp.Callable[[torch.Tensor], torch.Tensor],
    inputs: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None,
    rule: str,
) -> np.ndarray:
    resets = resets or {}
    exec_masks = exec_masks or {}
    batch, steps = inputs.shape[:2]
    all_on = torch.ones(batch, dtype=torch.bool)
    out = []
    with attention_window(rule), mimi.streaming(batch):
        for t in range(steps):
            if t in resets:
                mimi.reset_streaming(_mask(resets[t], batch))
            mimi.set_exec_mask(torch.tensor(exec_masks[t], dtype=torch.bool) if t in exec_masks else all_on)
            out.append(fn(torch.from_numpy(np.ascontiguousarray(inputs[:, t]))).numpy())
    return np.stack(out, axis=1)


def mimi_encode(
    mimi: MimiModel,
    pcm: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None = None,
    rule: str = "kyutai",
) -> np.ndarray:
    """Streaming encode of ``pcm`` ``[B, T, 1920]`` -> codes ``[B, T, K]``.

    ``resets[t]`` lists rows whose streams restart (``reset_streaming(mask)``)
    just before frame ``t``; ``exec_masks[t]`` is frame ``t``'s exec mask
    (``set_exec_mask``; rows off keep their state, their output is garbage).
    """
    return _mimi_stream(mimi, lambda x: mimi.encode(x.float()[:, None])[:, :, 0], pcm, resets, exec_masks, rule)


def mimi_decode(
    mimi: MimiModel,
    codes: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None = None,
    rule: str = "kyutai",
) -> np.ndarray:
    """Streaming decode of ``codes`` ``[B, T, K]`` -> pcm ``[B, T, 1920]`` (as :func:`mimi_encode`)."""
    return _mimi_stream(mimi, lambda c: mimi.decode(c.long()[:, :, None])[:, 0], codes, resets, exec_masks, rule)


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


def lag_user_frames(
    user_codes: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]],
    exec_masks: tp.Mapping[int, tp.Sequence[bool]],
) -> np.ndarray:
    """Each row's user frames moved one *executed* call later (see ``user_lag``).

    The first executed call after a start or reset gets zeros: moshi never
    reads the user frame of that call.
    """
    batch, steps, _ = user_codes.shape
    out = np.zeros_like(user_codes)
    last: list[np.ndarray | None] = [None] * batch
    for t in range(steps):
        for r in range(batch):
            if r in resets.get(t, ()):
                last[r] = None
            if t in exec_masks and not exec_masks[t][r]:
                continue
            if last[r] is not None:
                out[r, t] = last[r]
            last[r] = user_codes[r, t]
    return out


@torch.no_grad()
def lm_generate(
    lm: LMModel,
    user_codes: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None = None,
    semantics: Semantics = KYUTAI,
) -> np.ndarray:
    """Greedy ``LMGen`` run: user codes ``[B, T, 8]`` -> ``[B, T, 9]`` (text + agent audio).

    ``support_out_of_sync=True`` so that every step returns a tensor; rows
    still warming up (the first call after a start or reset) and rows not
    executing hold ``-2``.  ``resets[t]``: rows reset
    (``reset_streaming(mask)``) before step ``t``; ``exec_masks[t]``: the exec
    mask of step ``t`` (``set_exec_mask``), all-true otherwise.
    """
    from moshi.models.lm import LMGen

    resets = resets or {}
    exec_masks = exec_masks or {}
    if semantics.user_lag:
        user_codes = lag_user_frames(user_codes, resets, exec_masks)
    batch, steps, _ = user_codes.shape
    gen = LMGen(lm, use_sampling=False, support_out_of_sync=True)
    out = []
    all_on = torch.ones(batch, dtype=torch.bool)
    with attention_window(semantics.window, semantics.depformer_window), gen.streaming(batch):
        for t in range(steps):
            if t in resets:
                gen.reset_streaming(_mask(resets[t], batch))
            gen.set_exec_mask(torch.tensor(exec_masks[t], dtype=torch.bool) if t in exec_masks else all_on)
            codes = torch.from_numpy(np.ascontiguousarray(user_codes[:, t], dtype=np.int64))[:, :, None]
            tokens = gen.step(codes)
            assert tokens is not None  # support_out_of_sync: never None
            out.append(tokens[:, : 1 + 8, 0].numpy())
    return np.stack(out, axis=1)
