#!/usr/bin/env python3
"""bench/kernels: the torch operations one engine tick dispatches, counted on the CPU (issue 43).

The GPU tick is launch-bound: its time is the number of kernels more than
their size.  That number does not depend on the widths, so it is counted
here exactly, on the CPU, for the PersonaPlex-7B *structure* (32 temporal
layers, 6 depformer layers of which the engine runs 8 steps, the 8-layer
Mimi transformers, 16 codebooks, the real vocabularies, the LM in
bfloat16 as a GPU runs it) at small widths with random weights.

What counts as a kernel: every aten operation dispatched, except views and
other metadata-only ones (:data:`NOT_KERNELS`: ``view``, ``expand``,
``slice``, ``permute``, ``empty`` ...).  A function that is one fused
kernel on CUDA but a decomposition on the CPU (``F.rms_norm``,
``F.scaled_dot_product_attention``) counts once; the boolean attention
mask that aten's attention turns into an additive one on every call (on
CUDA too) counts as the three operations it is.  Syncs are the host reads
of device values: ``.item()``, ``bool()`` of a tensor, ``.cpu()``,
``.tolist()``, ``.numpy()`` (except of the engine's host staging buffers),
``nonzero`` and the like.

Counted: one steady tick (``PersonaPlexEngine.step``, every row LIVE and
sampling) at 1 and 64 rows, split by stage (Mimi encode, the temporal
transformer with its embedding and text head, the depformer, sampling,
Mimi decode, and the glue between them); one system-prompt chunk of 102
positions for 1 and 8 rows (``PersonaPlexEngine.prefill``); one frame of
voice making (``VoiceMaking.advance``).  Times need the GPU: ``bench/gpu/run``.

    python bench/kernels.py                       # prints the table
    python bench/kernels.py --json bench/results/kernels.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pplex_trio.engine._interface import Conversation, Sampling, SlotMode  # noqa: E402
from pplex_trio.engine._personaplex import PersonaPlexEngine  # noqa: E402
from pplex_trio.model import (  # noqa: E402
    CONFIGS,
    LMModel,
    LoadedTranscriber,
    Mimi,
    ModelConfig,
    RowNoise,
    SEANetConfig,
    SpeechToText,
    StreamingTransformer,
    STTConfig,
    Transcriber,
    TransformerConfig,
    VoiceMaking,
    _lockstep,  # noqa: E402
    random_model,
)
from pplex_trio.model._sampling import RowChoice  # noqa: E402

NOT_KERNELS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "expand",
        "slice",
        "select",
        "t",
        "transpose",
        "permute",
        "unsqueeze",
        "squeeze",
        "as_strided",
        "detach",
        "alias",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
        "narrow",
        "view_as_real",
        "view_as_complex",
        "unfold",
        "diagonal",
        "movedim",
        "empty",
        "empty_like",
        "empty_strided",
        "lift_fresh",
        "_local_scalar_dense",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "set_",
        "resize_",
        "_to_dense",
    }
)
"""Aten operations that launch no kernel: views, metadata, allocation (and the sync, counted apart)."""

SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "nonzero",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "equal",
        "repeat_interleave",
    }
)
"""Aten operations that read a device value on the host (``nonzero`` and the like size their output by it)."""

SYNC_METHODS = {torch.Tensor.cpu: "cpu", torch.Tensor.tolist: "tolist", torch.Tensor.numpy: "numpy"}

STAGES = ("mimi encode", "temporal", "depformer", "sampling", "mimi decode", "transcriber", "glue")


@dataclasses.dataclass
class Counts:
    """The kernels of one counted call, by stage and by operation, and its syncs."""

    kernels: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # by stage
    ops: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    stage_ops: dict[str, collections.Counter[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    syncs: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    dispatched: int = 0  # every aten operation, views included

    @property
    def total(self) -> int:
        return sum(self.kernels.values())

    def as_dict(self, top: int) -> dict[str, Any]:
        return {
            "kernels": self.total,
            "by_stage": {s: self.kernels[s] for s in STAGES if self.kernels[s]},
            "top_ops": dict(self.ops.most_common(top)),
            "syncs": sum(self.syncs.values()),
            "sync_ops": dict(self.syncs),
            "dispatched": self.dispatched,
            "stage_ops": {s: dict(c.most_common(top)) for s, c in self.stage_ops.items()},
        }


class KernelCounter(TorchDispatchMode):
    """Counts the aten operations that become kernels, by stage (see the module docstring)."""

    def __init__(self, host: Callable[[torch.Tensor], bool] = lambda t: False):
        super().__init__()
        self.counts = Counts()
        self.stages: list[str] = ["glue"]
        self.fused = 0  # > 0 inside a fused function: its decomposition is not counted
        self.host = host  # tensors that live on the host anyway (staging buffers): reading them is no sync

    def record(self, op: str) -> None:
        stage = self.stages[-1]
        self.counts.kernels[stage] += 1
        self.counts.ops[op] += 1
        self.counts.stage_ops[stage][op] += 1

    def sync(self, op: str) -> None:
        self.counts.syncs[f"{self.stages[-1]}: {op}"] += 1

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.stages.append(name)
        try:
            yield
        finally:
            self.stages.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        if not self.fused:
            self.counts.dispatched += 1
            if name in SYNC_OPS:
                self.sync(name)
            if name not in NOT_KERNELS:
                self.record(name)
        return func(*args, **(kwargs or {}))


class FusedCalls(TorchFunctionMode):
    """Counts ``F.rms_norm`` and attention once each, and the host reads of tensors (syncs)."""

    def __init__(self, counter: KernelCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        c = self.counter
        if func is F.scaled_dot_product_attention or func is F.rms_norm:
            if c.fused:
                return func(*args, **kwargs)
            if func is F.scaled_dot_product_attention:
                mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                if mask is not None and mask.dtype == torch.bool:  # aten's where(~mask, -inf, 0), every call
                    for op in ("logical_not", "scalar_tensor", "where"):
                        c.record(op)
            c.record("attention" if func is F.scaled_dot_product_attention else "rms_norm")
            c.fused += 1
            try:
                return func(*args, **kwargs)
            finally:
                c.fused -= 1
        if func in SYNC_METHODS and not c.fused and not c.host(args[0]):
            c.sync(SYNC_METHODS[func])
        return func(*args, **kwargs)


@contextlib.contextmanager
def counting(host: Callable[[torch.Tensor], bool] = lambda t: False) -> Iterator[Counts]:
    """Count what runs inside the block, by stage (the model's entry points are wrapped meanwhile)."""
    counter = KernelCounter(host)

    def staged(stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            with counter.stage(stage):
                return fn(*args, **kwargs)

        return run

    patches = [
        (Mimi, "encode_frame", "mimi encode"),
        (Mimi, "decode_frame", "mimi decode"),
        (LMModel, "embed", "temporal"),
        (LMModel, "temporal", "temporal"),
        (StreamingTransformer, "prefill", "temporal"),
        (LMModel, "depformer_step", "depformer"),
        (RowNoise, "draw", "sampling"),
        (RowChoice, "gumbel", "sampling"),
        (_lockstep, "choose", "sampling"),
        (Transcriber, "step", "transcriber"),
    ]
    saved = [(owner, attr, vars(owner)[attr]) for owner, attr, _ in patches]
    for owner, attr, stage in patches:
        setattr(owner, attr, staged(stage, getattr(owner, attr)))
    try:
        with FusedCalls(counter), counter:
            yield counter.counts
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


# --------------------------------------------------------------------------- the model


def structure_config() -> ModelConfig:
    """PersonaPlex-7B's structure (layer counts, heads' layout, codebooks, vocabularies, contexts) at small widths."""
    real = CONFIGS["personaplex-7b-v1"]
    lm = dataclasses.replace(
        real.lm, dim=64, num_heads=4, depformer_dim=32, depformer_num_heads=2, depformer_dim_feedforward=int(4.125 * 32)
    )
    mt = real.mimi.transformer
    mimi = dataclasses.replace(
        real.mimi,
        seanet=SEANetConfig(dimension=32, n_filters=4),
        quantizer=dataclasses.replace(real.mimi.quantizer, dimension=16, input_dimension=32, output_dimension=32),
        transformer=TransformerConfig(
            d_model=32,
            num_heads=2,
            num_layers=mt.num_layers,
            dim_feedforward=64,
            context=mt.context,
            norm=mt.norm,
            gating=mt.gating,
            layer_scale=mt.layer_scale,
        ),
    )
    return dataclasses.replace(real, name="personaplex-7b-v1 structure", lm=lm, mimi=mimi)


def stt_structure_config(model: Any) -> STTConfig:
    """Kyutai's 1B speech-to-text structure (``kyutai/stt-1b-en_fr``: 16 layers, 32 codebooks, 4 extra heads,
    its vocabularies and context) at small widths, reading the structure model's Mimi codes."""
    return STTConfig(
        name="stt-1b-en_fr structure",
        dim=64,
        num_heads=4,
        num_layers=16,
        context=750,
        text_card=8000,
        card=model.config.lm.card,
        n_q=32,
        extra_heads_num_heads=4,
        extra_heads_dim=6,
        mimi=model.config.mimi,
    )


def random_transcriber(model: Any) -> LoadedTranscriber:
    """A random-weight transcriber of :func:`stt_structure_config`, its LM in bfloat16 as on a GPU."""
    cfg = stt_structure_config(model)
    stt = SpeechToText(cfg).to(model.device, torch.bfloat16).eval()
    return LoadedTranscriber(cfg, stt, Mimi(cfg.mimi), model.tokenizer, model.device)


PERSONA = (
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way, "
    "and keep your answers short."
)


def _engine(model: Any, rows: int, transcriber: bool = False) -> PersonaPlexEngine:
    stt = random_transcriber(model) if transcriber else None
    return PersonaPlexEngine(model, rows, cuda_graph=False, transcriber=stt)  # (every op dispatched, even on CUDA)


def _conversation(row: int) -> Conversation:
    return Conversation(persona=PERSONA, sampling=Sampling(text_seed=row, audio_seed=row + 1))


def _pcm(rows: int, tick: int) -> np.ndarray:
    rng = np.random.default_rng(tick)
    return (0.1 * rng.standard_normal((rows, 1920))).astype(np.float32)


def _is_host(engine: PersonaPlexEngine) -> Callable[[torch.Tensor], bool]:
    tick = engine._tick
    staging = {t.untyped_storage().data_ptr() for t in (tick.host_live, tick.host_pcm, tick.host_packed)}
    return lambda t: isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in staging


def count_tick(model: Any, rows: int, warm: int = 3, transcriber: bool = False) -> Counts:
    """One steady tick with every row LIVE and sampling (the prompts done, ``warm`` ticks run before); with
    ``transcriber``, Kyutai's 1B speech-to-text structure beside it (:func:`random_transcriber`)."""
    engine = _engine(model, rows, transcriber)
    engine.prefill({row: engine.start(row, _conversation(row)) for row in range(rows)})
    live = [SlotMode.LIVE] * rows
    for i in range(warm):
        engine.step(live, _pcm(rows, i))
    with counting(_is_host(engine)) as counts:
        engine.step(live, _pcm(rows, warm))
    return counts


def count_prefill(model: Any, rows: int, positions: int = 102) -> Counts:
    """One prefill pass of ``positions`` prompt positions for each of ``rows`` rows that just started."""
    engine = _engine(model, rows)
    for row in range(rows):
        left = engine.start(row, _conversation(row))
        assert left >= positions, f"the prompt has {left} positions, fewer than {positions}"
    with counting(_is_host(engine)) as counts:
        done = engine.prefill({row: positions for row in range(rows)})
    assert done == {row: positions for row in range(rows)}
    return counts


def count_voice_frame(model: Any, frame: int = 3) -> Counts:
    """Frame ``frame`` of a voice being made from a recording (the frames before it made first)."""
    pcm = _pcm(1, 0)[0].repeat(frame + 2)
    p = model.config.prompt
    making = VoiceMaking(model.lm, model.mimi, pcm, p.sine_tokens, p.zero_text_code)
    making.advance(frame)
    with counting() as counts:
        making.advance(1)
    return counts


# --------------------------------------------------------------------------- report


def measure(tick_rows: list[int], prefill_rows: list[int]) -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="kernels-") as tmp:
        model = random_model(structure_config(), "cpu", torch.bfloat16, voice_dir=pathlib.Path(tmp), voices=1)
        runs: dict[str, Counts] = {}
        for rows in tick_rows:
            runs[f"tick, {rows} row{'s' * (rows > 1)}"] = count_tick(model, rows)
        for rows in tick_rows:
            runs[f"tick + 1B transcriber, {rows} row{'s' * (rows > 1)}"] = count_tick(model, rows, transcriber=True)
        for rows in prefill_rows:
            runs[f"prefill chunk (102 positions), {rows} row{'s' * (rows > 1)}"] = count_prefill(model, rows)
        runs["voice-making frame"] = count_voice_frame(model)
    cfg = model.config
    return {
        "model": {
            "name": cfg.name,
            "lm_dtype": "bfloat16",
            "temporal_layers": cfg.lm.num_layers,
            "depformer_layers": cfg.lm.depformer_num_layers,
            "depformer_steps_run": 8,
            "codebooks": cfg.lm.n_q,
            "mimi_transformer_layers": cfg.mimi.transformer.num_layers,
            "text_card": cfg.lm.text_card,
            "card": cfg.lm.card,
        },
        "torch": torch.__version__,
        "runs": runs,
    }


def table(runs: dict[str, Counts]) -> str:
    names = list(runs)
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for stage in STAGES:
        if any(runs[n].kernels[stage] for n in names):
            lines.append(f"| {stage} | " + " | ".join(str(runs[n].kernels[stage]) for n in names) + " |")
    lines.append("| **kernels** | " + " | ".join(f"**{runs[n].total}**" for n in names) + " |")
    lines.append("| syncs | " + " | ".join(str(sum(runs[n].syncs.values())) for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tick-rows", default="1,64", help="comma-separated row counts of the counted ticks")
    parser.add_argument("--prefill-rows", default="1,8", help="comma-separated row counts of the prefill chunks")
    parser.add_argument("--top", type=int, default=15, help="operations listed per run")
    parser.add_argument("--json", type=pathlib.Path, help="write the counts there")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    report = measure(
        [int(r) for r in args.tick_rows.split(",") if r], [int(r) for r in args.prefill_rows.split(",") if r]
    )
    runs: dict[str, Counts] = report["runs"]
    m = report["model"]
    print(
        f"# kernels dispatched, {m['name']} (LM {m['lm_dtype']}, {m['temporal_layers']} temporal layers, "
        f"{m['depformer_layers']} depformer layers x {m['depformer_steps_run']} steps, Mimi transformers of "
        f"{m['mimi_transformer_layers']} layers), torch {report['torch']}\n"
    )
    print(table(runs))
    for name, counts in runs.items():
        top = ", ".join(f"{op} {n}" for op, n in counts.ops.most_common(args.top))
        print(f"\n{name}: {top}" + (f"; syncs: {dict(counts.syncs)}" if counts.syncs else ""))
    print(f"\n({time.perf_counter() - began:.0f} s)")
    if args.json:
        out = dict(
            report,
            command="python bench/kernels.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            date=time.strftime("%Y-%m-%d"),
            runs={n: c.as_dict(args.top) for n, c in runs.items()},
        )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
