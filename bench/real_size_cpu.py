#!/usr/bin/env python3
"""bench/real_size_cpu: the real PersonaPlex-7B shapes end to end through the engine, on the CPU.

Without a GPU this still proves the real-size path runs: the
``personaplex-7b-v1`` config with random weights in bfloat16 (14.4 GB of LM
weights fit in this machine's 24 GB), one slot, the system prompt of a persona
and then a few live ticks through ``PersonaPlexEngine`` (Mimi encode, the LM
and its depformer, Mimi decode), not only the LM.  It records seconds per
prefill step and per live tick, and the peak RSS.  Minutes of CPU: kept out of
CI.  ``--quantize int8`` / ``--kv-cache fp8`` run the same with those options.

``--load`` measures loading instead: it writes a real-size checkpoint of
random bf16 weights once (16 GB on disk, in the cache), then loads it in a
fresh process in bf16 and again with ``--quantize int8`` and reports each
process's peak RSS.

    python bench/real_size_cpu.py --live-ticks 4 --name real-size-cpu
    python bench/real_size_cpu.py --load --name real-size-load
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import resource
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from engine_step import random_model, source_pcm  # noqa: E402

from pplex_trio._cache import cache_dir  # noqa: E402
from pplex_trio._conversation import FRAME_SIZE, Conversation, Sampling  # noqa: E402
from pplex_trio._precision import KVFormat, Precision, WeightFormat  # noqa: E402
from pplex_trio.engine._interface import SlotMode  # noqa: E402
from pplex_trio.engine._personaplex import PersonaPlexEngine  # noqa: E402
from pplex_trio.model import CONFIGS, LMModel, Mimi  # noqa: E402
from pplex_trio.model._config import LM_FILE, MIMI_FILE, TOKENIZER_FILE  # noqa: E402
from pplex_trio.model._kyutai_config import config_to_kyutai_dict  # noqa: E402
from pplex_trio.model._tiny import ensure_tiny_checkpoint  # noqa: E402

RESULTS = REPO / "bench" / "results"
PERSONA = "You enjoy having a good conversation."


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--live-ticks", type=int, default=4)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--name", default="real-size-cpu")
    parser.add_argument("--quantize", choices=[str(f) for f in WeightFormat], default="none")
    parser.add_argument("--kv-cache", choices=[str(f) for f in KVFormat], default="model")
    parser.add_argument("--load", action="store_true", help="measure the peak RSS of loading, bf16 vs int8")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    report: dict = {
        "command": " ".join(["python", "bench/real_size_cpu.py", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "threads": args.threads,
    }
    if args.load:
        report.update(load_peaks())
        return _write(report, args.name)

    started = time.perf_counter()
    model = random_model(CONFIGS["personaplex-7b-v1"], torch.device("cpu"), torch.bfloat16)
    model.lm.set_precision(Precision(WeightFormat(args.quantize), KVFormat(args.kv_cache)))
    report["precision"] = model.lm.precision.describe()
    report["build_s"] = time.perf_counter() - started
    report["lm_parameters"] = sum(p.numel() for p in model.lm.parameters())
    report["rss_after_build_gb"] = peak_rss_gb()
    print(
        f"built {report['lm_parameters'] / 1e9:.2f} B LM parameters in {report['build_s']:.0f} s, "
        f"peak RSS {report['rss_after_build_gb']:.1f} GB",
        flush=True,
    )

    engine = PersonaPlexEngine(model, 1)
    steps = engine.start(0, Conversation(persona=PERSONA, sampling=Sampling(greedy=True)))
    with torch.inference_mode():
        t = time.perf_counter()
        engine.prefill({0: steps})
        prefill = [(time.perf_counter() - t) / max(steps, 1)] * steps
        print(f"system prompt: {steps} positions in one prefill, {time.perf_counter() - t:.1f} s", flush=True)
        pcm = source_pcm()
        live: list[float] = []
        texts = []
        for i in range(args.live_ticks):
            frame = pcm[None, i * FRAME_SIZE : (i + 1) * FRAME_SIZE]
            t = time.perf_counter()
            out = engine.step([SlotMode.LIVE], frame)
            live.append(time.perf_counter() - t)
            assert out.pcm.shape == (1, FRAME_SIZE) and np.isfinite(out.pcm).all()
            texts.append(out.text[0])
    report.update(
        prefill_steps=len(prefill),
        prefill_s_median=float(np.median(prefill)) if prefill else None,
        live_ticks=len(live),
        live_s=[round(x, 3) for x in live],
        live_s_median=float(np.median(live)),
        peak_rss_gb=peak_rss_gb(),
        total_s=time.perf_counter() - started,
    )
    print(
        f"live: {len(live)} ticks, {report['live_s_median']:.2f} s each (median; real time needs 0.08 s), "
        f"peak RSS {report['peak_rss_gb']:.1f} GB, texts {texts}"
    )
    return _write(report, args.name)


def _write(report: dict, name: str) -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {RESULTS / (name + '.json')}")
    return 0


_LOAD = """
import json, resource, sys, time, torch
from pplex_trio._precision import Precision, WeightFormat
from pplex_trio.model import load_model
began = time.perf_counter()
model = load_model(sys.argv[1], dtype=torch.bfloat16, precision=Precision(WeightFormat(sys.argv[2])))
print(json.dumps({"load_s": time.perf_counter() - began,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2,
                  "lm_gb": sum(t.numel() * t.element_size() for t in model.lm.state_dict().values()) / 1e9}))
"""


def load_peaks() -> dict:
    """Peak RSS of a fresh process loading the real-size random checkpoint in bf16, then with int8 weights."""
    folder = random_checkpoint(cache_dir() / "bench-real-size-random")
    out = {"checkpoint_gb": (folder / LM_FILE).stat().st_size / 1e9}
    for quantize in ("none", "int8"):
        done = subprocess.run(
            [sys.executable, "-c", _LOAD, str(folder), quantize], cwd=REPO, check=True, capture_output=True, text=True
        )
        out[quantize] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"load --quantize {quantize}: {out[quantize]}", flush=True)
    out["int8_over_bf16_peak_rss"] = out["int8"]["peak_rss_gb"] / out["none"]["peak_rss_gb"]
    print(f"peak RSS int8 / bf16: {out['int8_over_bf16_peak_rss']:.2f}")
    return out


def random_checkpoint(folder: pathlib.Path) -> pathlib.Path:
    """A ``personaplex-7b-v1``-shaped checkpoint of random bf16 weights (written once, tensor by tensor)."""
    cfg = CONFIGS["personaplex-7b-v1"]
    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        lm, mimi = LMModel(cfg.lm), Mimi(cfg.mimi)
    generator = torch.Generator().manual_seed(0)
    for module, name, dtype in ((lm, LM_FILE, torch.bfloat16), (mimi, MIMI_FILE, torch.float32)):
        _write_safetensors(folder / name, module.state_dict(), dtype, generator)
    tiny = ensure_tiny_checkpoint()
    shutil.copyfile(tiny / TOKENIZER_FILE, folder / TOKENIZER_FILE)
    (folder / "config.json").write_text(json.dumps(config_to_kyutai_dict(cfg), indent=2))
    return folder


def _write_safetensors(
    path: pathlib.Path, shapes: dict[str, torch.Tensor], dtype: torch.dtype, generator: torch.Generator
) -> None:
    """safetensors, one random tensor at a time (the file's layout: a JSON header, then the raw bytes)."""
    names = {torch.bfloat16: "BF16", torch.float32: "F32"}
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, meta in shapes.items():
        size = meta.numel() * dtype.itemsize
        header[key] = {"dtype": names[dtype], "shape": list(meta.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for meta in shapes.values():
            tensor = (torch.randn(meta.shape, generator=generator) * 0.02).to(dtype)
            f.write(tensor.view(torch.uint8).numpy().tobytes())


if __name__ == "__main__":
    raise SystemExit(main())
