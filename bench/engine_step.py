#!/usr/bin/env python3
"""Engine tick benchmark: our ``PersonaPlexEngine`` against Kyutai's ``moshi`` on the same weights.

One *tick* is what a server does every 80 ms for all B conversation slots:
Mimi encode of one frame per row, one LM step (temporal transformer +
depformer, greedy), Mimi decode of the agent codes, and the read-back of the
results to the host.  Warm-up ticks (and each row's system prompt) are not
timed; on CUDA the clock is read after ``torch.cuda.synchronize()``.

Commands, from the repository root::

    python bench/engine_step.py
        CPU, the tiny PersonaPlex-style checkpoint of the oracle tests (dep_q 16,
        random weights, built in a temporary folder), ours vs moshi 0.2.13 side
        by side, B = 1, 4, 8, 16.
    python bench/engine_step.py --checkpoint ../shared/golden/tiny-public
        any local checkpoint folder (our loader and moshi's both read it).
    python bench/engine_step.py --config personaplex-7b-v1 --random-weights --device cuda
        the real PersonaPlex-7B shapes with random weights on a GPU (LM in
        bfloat16), ours only, B = 1, 8, 16, 32, 64, with peak GPU memory, eager
        and with the engine's CUDA graph (``--cuda-graph off|on|both``).  The
        GPU machine's whole first run (equality, sweep, profile, the server
        under load) is ``bench/gpu/run``; this is the quick table.

It prints a table (one row per B): p50 and p99 milliseconds per tick, and on
CPU moshi's figures and the ratio ours/moshi (below 1: we are faster).
``bench/README.md`` explains the columns.  The moshi side runs moshi 0.2.13's
own ``LMGen`` with all ``dep_q`` depformer steps, as the PersonaPlex reference
does; ours runs only the agent's 8 by default (``--ours-depformer-steps 16``
for like-for-like arithmetic).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import inspect
import logging
import os
import pathlib
import sys
import tempfile
import time
import typing as tp

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "oracle"))  # the tiny-checkpoint builder shared with the tests

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # moshi: no torch.compile of its CPU helpers

import _tiny_moshi as tiny  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from pplex_trio._precision import KVFormat, Precision, WeightFormat  # noqa: E402
from pplex_trio.engine._interface import Conversation, Sampling, SlotMode  # noqa: E402
from pplex_trio.engine._personaplex import PersonaPlexEngine  # noqa: E402
from pplex_trio.model import CONFIGS, LoadedModel, load_model, random_model  # noqa: E402

logger = logging.getLogger("bench.engine_step")

SPEECH = REPO.parent / "shared" / "data" / "speech_assistant.wav"
CPU_BATCHES = (1, 4, 8, 16)
CUDA_BATCHES = (1, 8, 16, 32, 64)


@dataclasses.dataclass
class Timing:
    p50: float
    p99: float
    peak_gib: float | None = None

    @classmethod
    def of(cls, ms: list[float], peak_bytes: int | None = None) -> Timing:
        return cls(
            float(np.percentile(ms, 50)),
            float(np.percentile(ms, 99)),
            None if peak_bytes is None else peak_bytes / 2**30,
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Tick = tp.Callable[[int], None]


def time_interleaved(ticks: list[Tick], warmup: int, iters: int, device: torch.device) -> list[list[float]]:
    """Milliseconds of each of ``iters`` ticks per callable, after ``warmup`` untimed ones.

    The callables take turns tick by tick, so background load on a shared
    machine hits them alike and their ratio stays meaningful.
    """
    for i in range(warmup):
        for tick in ticks:
            tick(i)
    times: list[list[float]] = [[] for _ in ticks]
    for i in range(iters):
        for tick, sink in zip(ticks, times, strict=True):
            _sync(device)
            start = time.perf_counter()
            tick(warmup + i)
            _sync(device)
            sink.append((time.perf_counter() - start) * 1000)
    return times


# --------------------------------------------------------------------------- inputs


def source_pcm() -> np.ndarray:
    """Mono float32 24 kHz audio: the shared speech file, or a voice-like synthetic if it is absent."""
    if SPEECH.is_file():
        return tiny.load_speech(SPEECH)
    logger.info("%s not found: using synthetic audio", SPEECH)
    t = np.arange(40 * tiny.SAMPLE_RATE) / tiny.SAMPLE_RATE
    pitch = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    voiced = np.sin(2 * np.pi * np.cumsum(pitch) / tiny.SAMPLE_RATE) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    noise = np.random.default_rng(0).standard_normal(t.shape)
    return (0.2 * voiced + 0.01 * noise).astype(np.float32)


def frames_for(pcm: np.ndarray, batch: int, count: int) -> np.ndarray:
    """``[count, B, 1920]``: row ``r`` plays ``pcm`` from ``1.3 * r`` seconds on (wrapping around)."""
    hop = int(1.3 * tiny.SAMPLE_RATE)
    index = (np.arange(count * tiny.FRAME_SIZE)[None, :] + hop * np.arange(batch)[:, None]) % pcm.shape[0]
    return pcm[index].reshape(batch, count, tiny.FRAME_SIZE).transpose(1, 0, 2).copy()


# --------------------------------------------------------------------------- ours


def engine_supports_cuda_graph() -> bool:
    return "cuda_graph" in inspect.signature(PersonaPlexEngine.__init__).parameters


@contextlib.contextmanager
def ours_ticks(
    model: LoadedModel, batch: int, frames: np.ndarray, depformer_steps: int | None, cuda_graph: bool | None
) -> tp.Iterator[Tick]:
    """Our engine with ``batch`` LIVE rows (system prompts already replayed): one call = one tick."""
    kwargs: dict[str, tp.Any] = {"depformer_steps": depformer_steps}
    if cuda_graph is not None:
        kwargs["cuda_graph"] = cuda_graph
    engine = PersonaPlexEngine(model, batch, **kwargs)
    conversation = Conversation(sampling=Sampling(greedy=True))
    engine.prefill({slot: engine.start(slot, conversation) for slot in range(batch)})
    live = [SlotMode.LIVE] * batch

    def tick(i: int) -> None:
        engine.step(live, frames[i % len(frames)])

    yield tick


# --------------------------------------------------------------------------- moshi


class MoshiOracle:
    """moshi 0.2.13's Mimi and ``LMGen`` loaded from the same checkpoint folder."""

    def __init__(self, directory: pathlib.Path):
        import moshi

        self.version = getattr(moshi, "__version__", "?")
        self.mimi = tiny.load_moshi_mimi(directory)
        self.lm = tiny.load_moshi_lm(directory)

    @contextlib.contextmanager
    def ticks(self, batch: int, frames: np.ndarray) -> tp.Iterator[Tick]:
        """moshi's Mimi and greedy ``LMGen`` streaming ``batch`` rows: one call = one tick."""
        from moshi.models.lm import LMGen

        gen = LMGen(self.lm, use_sampling=False, support_out_of_sync=True)
        card = self.lm.card

        @torch.no_grad()
        def tick(i: int) -> None:
            codes = self.mimi.encode(torch.from_numpy(frames[i % len(frames)])[:, None])
            tokens = gen.step(codes)
            agent = tokens[:, 1:9].clamp(0, card - 1)  # -2 while warming up: decode any valid codes
            self.mimi.decode(agent).numpy()
            tokens.numpy()

        with self.mimi.streaming(batch), gen.streaming(batch):
            yield tick


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", type=pathlib.Path, help="a checkpoint folder (default: build the oracle's tiny one)")
    p.add_argument("--config", choices=sorted(CONFIGS), help="a named config of ours (needs --random-weights)")
    p.add_argument("--random-weights", action="store_true", help="random weights for --config (no download)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--batch-sizes", help="comma-separated B values (default 1,4,8,16 on CPU; 1,8,16,32,64 on CUDA)")
    p.add_argument("--iters", type=int, help="timed ticks per B (default 50 on CPU, 100 on CUDA)")
    p.add_argument("--warmup", type=int, help="untimed ticks per B (default 5 on CPU, 10 on CUDA)")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: tiny ops gain nothing from more)"
    )
    p.add_argument("--no-oracle", action="store_true", help="time ours only")
    p.add_argument("--ours-depformer-steps", type=int, help="depformer steps our engine runs (default: its own, 8)")
    p.add_argument("--quantize", choices=[str(f) for f in WeightFormat], default="none", help="ours: int8 weights")
    p.add_argument("--kv-cache", choices=[str(f) for f in KVFormat], default="model", help="ours: an fp8 KV cache")
    p.add_argument(
        "--cuda-graph",
        choices=("off", "on", "both"),
        default="both",
        help="CUDA only, if the engine supports it (default both)",
    )
    args = p.parse_args(argv)
    if args.config and not args.random_weights:
        p.error("--config needs --random-weights (to load real weights use --checkpoint)")
    if args.config and args.checkpoint:
        p.error("use either --config or --checkpoint")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"error: --device {args.device} but CUDA is not available", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    batches = (
        [int(b) for b in args.batch_sizes.split(",")]
        if args.batch_sizes
        else list(CUDA_BATCHES if cuda else CPU_BATCHES)
    )
    iters = args.iters or (100 if cuda else 50)
    warmup = args.warmup or (10 if cuda else 5)
    lm_dtype = torch.bfloat16 if cuda else torch.float32

    pcm = source_pcm()
    with tempfile.TemporaryDirectory(prefix="engine-step-") as tmp:
        if args.config:
            label = f"{args.config} (random weights)"
            model = random_model(CONFIGS[args.config], device, lm_dtype)
            directory = None
        else:
            directory = args.checkpoint
            if directory is None:
                spec = tiny.PERSONAPLEX_DEP16
                directory = tiny.make_checkpoint(pathlib.Path(tmp) / spec.name, spec, pcm)
                label = f"oracle tiny checkpoint {spec.name} (random weights, seed {spec.seed})"
            else:
                label = str(directory)
            model = load_model(str(directory), device=device, dtype=lm_dtype)
        model.lm.set_precision(Precision(WeightFormat(args.quantize), KVFormat(args.kv_cache)))
        oracle = None
        if not (args.no_oracle or cuda or directory is None):
            oracle = MoshiOracle(directory)
        graph_modes: list[bool | None] = [None]
        if cuda and engine_supports_cuda_graph():
            graph_modes = {"off": [False], "on": [True], "both": [False, True]}[args.cuda_graph]

        lm = model.config.lm
        print("# engine_step: ms per tick = Mimi encode + LM step (greedy) + Mimi decode + read-back, all B rows")
        print(
            f"# model: {label}: dim {lm.dim}, {lm.num_layers} layers, dep_q {lm.dep_q}, context {lm.context}; "
            f"ours: {model.lm.precision.describe()}"
        )
        print(
            f"# device {device} LM {str(lm_dtype).removeprefix('torch.')} threads {torch.get_num_threads()} "
            f"warmup {warmup} iters {iters} torch {torch.__version__}" + (f" moshi {oracle.version}" if oracle else "")
        )
        print(f"# command: python bench/engine_step.py {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
        if oracle:
            print(
                f"# ours runs {args.ours_depformer_steps or min(lm.dep_q, lm.num_agent_codebooks)} depformer steps,"
                f" moshi {oracle.lm.dep_q}; ratio = ours p50 / moshi p50"
            )
        if cuda and not engine_supports_cuda_graph():
            print("# cuda graph: not supported by PersonaPlexEngine yet (eager only)")
        header = ["B"] + (["cuda_graph"] if graph_modes != [None] else []) + ["ours_p50_ms", "ours_p99_ms"]
        header += ["peak_GiB"] if cuda else []
        header += ["moshi_p50_ms", "moshi_p99_ms", "ratio"] if oracle else []
        print("  ".join(f"{h:>12}" for h in header))
        for batch in batches:
            frames = frames_for(pcm, batch, warmup + iters)
            for graph in graph_modes:
                row: list[str] = [str(batch)]
                row += [("on" if graph else "off")] if graph is not None else []
                try:
                    with contextlib.ExitStack() as stack:
                        ticks = [
                            stack.enter_context(ours_ticks(model, batch, frames, args.ours_depformer_steps, graph))
                        ]
                        if oracle:
                            ticks.append(stack.enter_context(oracle.ticks(batch, frames)))
                        if cuda:
                            torch.cuda.reset_peak_memory_stats(device)
                        times = time_interleaved(ticks, warmup, iters, device)
                        peak = torch.cuda.max_memory_allocated(device) if cuda else None
                except Exception as exc:  # noqa: BLE001 - a failing cell is reported, the sweep goes on
                    logger.warning("B=%d: %s: %s", batch, type(exc).__name__, exc)
                    row += ["OOM" if isinstance(exc, torch.OutOfMemoryError) else "error"] * (len(header) - len(row))
                    print("  ".join(f"{c:>12}" for c in row), flush=True)
                    continue
                finally:
                    ticks = []  # the cell's engine goes before the next is built
                    gc.collect()
                    if cuda:
                        torch.cuda.empty_cache()
                ours = Timing.of(times[0], peak)
                row += [f"{ours.p50:.2f}", f"{ours.p99:.2f}"]
                row += [f"{ours.peak_gib:.2f}"] if cuda else []
                if oracle:
                    theirs = Timing.of(times[1])
                    row += [f"{theirs.p50:.2f}", f"{theirs.p99:.2f}", f"{ours.p50 / theirs.p50:.2f}"]
                print("  ".join(f"{c:>12}" for c in row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
