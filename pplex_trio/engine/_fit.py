"""How many conversations fit a GPU: the memory of a model and of its engine, from the model's config.

Nothing here is a constant: the model and the engine's device state are
built on the ``meta`` device (shapes and dtypes, no memory), so the figures
are the bytes of exactly the tensors the engine allocates, for any config.

* **weights**: every parameter and buffer of the LM (in its dtype) and of
  Mimi (float32);
* **per conversation**: the engine state one more row adds (the LM's KV
  ring, Mimi's and the depformer's states, the sampling
  settings, the I/O buffers), plus the peak of the temporaries one tick
  allocates for one more row (measured by running a tick on ``meta`` and
  following every tensor it creates);
* **fixed**: what the engine needs whatever the number of rows (the same
  measurement at one row, less one row's share), and the temporaries of the
  largest pass of system prompts the engine makes between ticks.

A GPU also holds the CUDA context, cuBLAS workspaces and the allocator's
slack, which no config describes: that is the *reserve* the caller leaves
(``--gpu-memory-reserve``).
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch._ops import OpOverload
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .._precision import KVFormat, Precision, WeightFormat
from ..model import LMModel, LoadedModel, Mimi, ModelConfig, VoiceLibrary
from ._device_tick import PASS_POSITIONS, DeviceTick
from ._settings import OFF_GPU_SLOTS

logger = logging.getLogger(__name__)

GIB = 2**30


class NotEnoughMemory(ValueError):
    """The model, or the conversations asked for, do not fit the device; the message says what does."""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes of one model on one device; :meth:`conversations` is how many fit."""

    model: str
    dtype: str
    precision: Precision
    weights: int
    fixed: int
    per_conversation: int
    parts: dict[str, int]  # what one conversation's bytes are made of (they add up to per_conversation)

    def conversations(self, memory: int, reserve: int = 0) -> int:
        """Conversations that fit ``memory`` bytes with ``reserve`` of them left alone (0 when none does)."""
        return max(0, (memory - reserve - self.weights - self.fixed) // self.per_conversation)

    def conversations_after_load(self, free: int, reserve: int = 0) -> int:
        """The same from the ``free`` bytes left once the weights are on the device."""
        return self.conversations(free + self.weights, reserve)

    def as_dict(self, memory: int, reserve: int) -> dict[str, Any]:
        """The plan in GiB, with the conversations that fit ``memory`` bytes less ``reserve`` (``fit``'s JSON)."""
        return {
            "model": self.model,
            "dtype": self.dtype,
            "quantize": str(self.precision.weights),
            "kv_cache": str(self.precision.kv_cache),
            "weights_gib": self.weights / GIB,
            "fixed_gib": self.fixed / GIB,
            "per_conversation_gib": self.per_conversation / GIB,
            "per_conversation_parts_gib": {name: size / GIB for name, size in self.parts.items()},
            "gpu_memory_gib": memory / GIB,
            "reserve_gib": reserve / GIB,
            "conversations": self.conversations(memory, reserve),
        }


def plan_memory(
    cfg: ModelConfig,
    lm_dtype: torch.dtype = torch.bfloat16,
    *,
    depformer_steps: int | None = None,
    precision: Precision = Precision(),
) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``cfg`` with its LM in ``lm_dtype`` stored as ``precision`` says (built on
    ``meta``: no memory used; a few seconds for the 7B shapes, so each plan is kept)."""
    key = (repr(cfg), lm_dtype, depformer_steps, precision)
    if key not in _PLANS:
        _PLANS[key] = _plan_memory(cfg, lm_dtype, depformer_steps, precision)
    return _PLANS[key]


_PLANS: dict[tuple[str, torch.dtype, int | None, Precision], MemoryPlan] = {}
SPAN = 32  # the plan measures a tick of 1 row and of 1 + SPAN rows


def _plan_memory(
    cfg: ModelConfig, lm_dtype: torch.dtype, depformer_steps: int | None, precision: Precision
) -> MemoryPlan:
    with torch.device("meta"):
        lm = LMModel(cfg.lm).to(lm_dtype)
        mimi = Mimi(cfg.mimi)
    lm.set_precision(precision)
    model = LoadedModel(
        config=cfg,
        lm=lm,
        mimi=mimi,
        tokenizer=None,  # type: ignore[arg-type]  # unused here
        voices=VoiceLibrary(None),
        device=torch.device("meta"),
    )
    weights = sum(_bytes(t) for module in (lm, mimi) for t in [*module.parameters(), *module.buffers()])
    # A tick's peak is the largest of several moments, some fixed (a weight's temporaries), some growing with
    # the rows (attention over the rings): measured far apart, the slope is the one that decides at scale.
    one, many = (_tick_bytes(model, rows, depformer_steps) for rows in (1, 1 + SPAN))
    parts = {name: -(-(many[name] - one[name]) // SPAN) for name in one}
    per_conversation = sum(parts.values())
    return MemoryPlan(
        model=cfg.name,
        dtype=str(lm_dtype).removeprefix("torch."),
        precision=precision,
        weights=weights,
        fixed=sum(one.values()) - per_conversation + _prompt_pass_bytes(model),
        per_conversation=per_conversation,
        parts=parts,
    )


def free_device_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` now; None where there is no device memory to size by (off CUDA)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free


def auto_slots(model: LoadedModel, reserve: int, *, depformer_steps: int | None = None, extra: int = 0) -> int:
    """``--slots auto``: the conversations that fit the device's free memory now, the weights loaded (a
    transcriber's too: ``extra`` is its bytes per conversation).

    Logs the figures.  Error handling: :class:`NotEnoughMemory` when not even one fits.
    """
    free = free_device_memory(model.device)
    if free is None:
        logger.info("--slots auto: %d conversations (%s: no GPU memory to size them by)", OFF_GPU_SLOTS, model.device)
        return OFF_GPU_SLOTS
    plan = plan_memory(model.config, model.lm.dtype, depformer_steps=depformer_steps, precision=model.lm.precision)
    per_conversation = plan.per_conversation + extra
    count = max(0, (free - reserve - plan.fixed) // per_conversation)
    figures = (
        f"{free / GIB:.1f} GiB free on {model.device} with the weights loaded, {plan.fixed / GIB:.2f} GiB "
        f"fixed, {per_conversation / GIB:.3f} GiB per conversation, {reserve / GIB:.1f} GiB reserve"
    )
    if count < 1:
        raise NotEnoughMemory(
            f"no conversation fits: {figures}; free some GPU memory, lower "
            "--gpu-memory-reserve, or use a GPU with more memory"
        )
    logger.info("--slots auto: %d conversations fit (%s)", count, figures)
    return count


def out_of_memory_message(
    doing: str,
    cfg: ModelConfig,
    lm_dtype: torch.dtype,
    device: torch.device,
    slots: int | None,
    precision: Precision = Precision(),
) -> str:
    """One line for an out-of-memory error: the figures, and what to do."""
    plan = plan_memory(cfg, lm_dtype, precision=precision)
    where = str(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        where += f" ({total / GIB:.1f} GiB in all, {free / GIB:.1f} GiB free now)"
        fit = plan.conversations(total, 0)
    else:
        fit = None
    stored = plan.dtype if precision == Precision() else f"{plan.dtype}, {precision.describe()}"
    need = (
        f"{cfg.name} needs {plan.weights / GIB:.1f} GiB of weights ({stored}) and "
        f"{plan.per_conversation / GIB:.2f} GiB per conversation"
    )
    smaller = (
        "" if precision == Precision(WeightFormat.INT8, KVFormat.FP8) else "--quantize int8 and --kv-cache fp8, or "
    )
    if fit is None or fit < 1:
        advice = f"use {smaller}a device with more memory"
    else:
        advice = (
            f"at most {fit} conversations fit this GPU with nothing else on it (`pplex-trio fit`): pass "
            f"--slots auto or a smaller --slots, or use a GPU with more memory"
        )
    asked = f" for {slots} conversations" if slots else ""
    return f"out of memory while {doing}{asked} on {where}: {need}; {advice}"


def engine_state_bytes(tick: DeviceTick) -> dict[str, int]:
    """Bytes of the device tensors a tick owns, by part (each storage counted once)."""
    groups: dict[str, list[object]] = {
        "lm_kv_ring": [tick.gen.state],
        "depformer": [tick.gen.depformer_cache],
        "mimi": [tick.encoder, tick.decoder],
        "sampling": [tick.sampling, tick.noise],
        "buffers": [tick.gen.cache, tick.live, tick.pcm, tick.packed, tick.free_tokens],
    }
    seen: set[int] = set()
    out = {}
    for name, objects in groups.items():
        out[name] = sum(
            t.untyped_storage().nbytes()
            for obj in objects
            for t in _tensors(obj)
            if t.device == tick.device and _claim(t, seen)
        )
    return out


def _tick_bytes(model: LoadedModel, rows: int, depformer_steps: int | None) -> dict[str, int]:
    tick = DeviceTick(model, rows, depformer_steps=depformer_steps)
    state = engine_state_bytes(tick)
    state["tick_temporaries"] = peak_bytes(tick.run, tick.device)
    return state


def _prompt_pass_bytes(model: LoadedModel) -> int:
    """The temporaries of the largest system-prompt pass the engine makes (``PASS_POSITIONS`` positions)."""
    positions = min(PASS_POSITIONS, model.config.lm.context)
    tick = DeviceTick(model, 1)
    inputs = torch.zeros(1, positions, model.config.lm.num_streams, dtype=torch.long, device=model.device)
    return peak_bytes(lambda: tick.gen.prefill([0], [0], [positions], inputs), model.device)


def peak_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """The peak of the bytes that ``fn`` allocates on ``device`` and holds at once (views and in-place
    results are not new memory).  Works on ``meta``: it follows tensors, not an allocator.

    Attention is counted as the CUDA engine runs it (the memory-efficient kernel: a float bias from the
    mask, the output), not as the math kernel that ``meta`` would decompose it into, which makes float32
    copies of the keys and values.
    """
    live = _LiveBytes(device)
    with _EfficientAttention(), live:
        fn()
    return live.peak


class _EfficientAttention(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v, *rest = args
        mask = rest[0] if rest else kwargs.get("attn_mask")
        bias = None
        if mask is not None:
            bias = mask
            if mask.dtype == torch.bool:
                bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)[0]


class _LiveBytes(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__ is unannotated
    """Follows every storage an op creates until its last tensor is gone."""

    def __init__(self, device: torch.device):
        super().__init__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init__ is unannotated
        self.device = device
        self.refs: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def __torch_dispatch__(
        self, func: OpOverload, types: Collection[type], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device != self.device:
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key not in self.refs:
                if aliases:
                    continue  # a view of, or an in-place op on, memory from before
                self.refs[key] = 0
                self.now += storage.nbytes()
                self.peak = max(self.peak, self.now)
            self.refs[key] += 1
            weakref.finalize(t, self._release, key, storage.nbytes())
        return out

    def _release(self, key: int, size: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.now -= size


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _claim(t: torch.Tensor, seen: set[int]) -> bool:
    key = t.untyped_storage()._cdata
    if key in seen:
        return False
    seen.add(key)
    return True


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    if hasattr(obj, "__dict__"):
        return [t for value in vars(obj).values() for t in _tensors(value)]
    return []
