#!/usr/bin/env python3
"""bench/quant_compare: ``pplex-trio compare`` for every 8-bit choice, side by side, on one model.

``--model`` is a checkpoint (``tiny``, the golden folder, a real one); with
``--real-shapes`` the model is ``personaplex-7b-v1``'s widths with random
weights in bfloat16 and ``--layers`` of its 32 temporal layers (two copies
must fit this machine's memory).  The caller's audio is the shared speech
file, repeated to ``--minutes``.  For each of ``--quantize int8``,
``--kv-cache fp8`` and both: top-1 agreement and KL against full precision
(teacher-forced), the first minute against the last, ms per step.

    python bench/quant_compare.py --model tiny --minutes 5 --name quant-tiny
    python bench/quant_compare.py --model ../shared/golden/tiny-public --minutes 1 --name quant-golden
    python bench/quant_compare.py --real-shapes --layers 4 --minutes 0.4 --name quant-real-shapes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import sys
import time

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from engine_step import source_pcm  # noqa: E402

from pplex_trio._cli._quantize import table  # noqa: E402
from pplex_trio._precision import KVFormat, Precision, WeightFormat  # noqa: E402
from pplex_trio.engine._compare import compare  # noqa: E402
from pplex_trio.engine._interface import Conversation, Sampling  # noqa: E402
from pplex_trio.engine._personaplex import PersonaPlexEngine  # noqa: E402
from pplex_trio.model import CONFIGS  # noqa: E402
from pplex_trio.model._random import random_model  # noqa: E402

RESULTS = REPO / "bench" / "results"
PERSONA = "You work for a bank. Be brief, friendly and precise; confirm the caller's details before acting."
CHOICES = (Precision(WeightFormat.INT8), Precision(kv_cache=KVFormat.FP8), Precision(WeightFormat.INT8, KVFormat.FP8))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--real-shapes", action="store_true")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--name", default="quant-compare")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    speech = source_pcm()
    frames = int(args.minutes * 750)
    pcm = np.resize(speech, frames * 1920).astype(np.float32)
    report: dict = {
        "command": " ".join(["python", "bench/quant_compare.py", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "torch": torch.__version__,
        "runs": [],
    }
    reference = _engine(args, Precision())
    for precision in CHOICES:
        began = time.perf_counter()
        conversation = Conversation(persona=PERSONA, sampling=Sampling(text_seed=1, audio_seed=2))
        result = compare(reference, _engine(args, precision), conversation, pcm)
        summary = {
            "model": reference.model.config.name,
            "device": "cpu",
            "lm_dtype": str(reference.model.lm.dtype),
            "quantize": str(precision.weights),
            "kv_cache": str(precision.kv_cache),
            **result.summary(),
            "seconds": time.perf_counter() - began,
        }
        report["runs"].append(summary)
        print(table(summary), flush=True)
        print(flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {RESULTS / (args.name + '.json')}")
    return 0


def _engine(args: argparse.Namespace, precision: Precision) -> PersonaPlexEngine:
    if not args.real_shapes:
        return PersonaPlexEngine.load(args.model, 1, precision=precision)
    cfg = CONFIGS["personaplex-7b-v1"]
    cfg = dataclasses.replace(
        cfg,
        name=f"personaplex-7b-v1 widths, {args.layers} layers, random",
        lm=dataclasses.replace(cfg.lm, num_layers=args.layers),
    )
    model = random_model(cfg, "cpu", torch.bfloat16)  # the same seed: the same weights each time
    model.lm.set_precision(precision)
    return PersonaPlexEngine(model, 1)


if __name__ == "__main__":
    raise SystemExit(main())
