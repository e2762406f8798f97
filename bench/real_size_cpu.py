#!/usr/bin/env python3
"""bench/real_size_cpu: the real PersonaPlex-7B shapes end to end through the engine, on the CPU.

Without a GPU this still proves the real-size path runs: the
``personaplex-7b-v1`` config with random weights in bfloat16 (14.4 GB of LM
weights fit in this machine's 24 GB), one slot, the system prompt of a persona
and then a few live ticks through ``PersonaPlexEngine`` (Mimi encode, the LM
and its depformer, Mimi decode), not only the LM.  It records seconds per
prefill step and per live tick, and the peak RSS.  Minutes of CPU: kept out of
CI.

    python bench/real_size_cpu.py --live-ticks 4 --name real-size-cpu
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import resource
import sys
import time

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from engine_step import random_model, source_pcm  # noqa: E402

from pplex_trio._conversation import FRAME_SIZE, Conversation, Sampling  # noqa: E402
from pplex_trio.engine._interface import SlotMode  # noqa: E402
from pplex_trio.engine._personaplex import PersonaPlexEngine  # noqa: E402
from pplex_trio.model import CONFIGS  # noqa: E402

RESULTS = REPO / "bench" / "results"
PERSONA = "You enjoy having a good conversation."


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--live-ticks", type=int, default=4)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--name", default="real-size-cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    report: dict = {"command": " ".join(["python", "bench/real_size_cpu.py", *(argv or sys.argv[1:])]),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S"), "threads": args.threads}

    started = time.perf_counter()
    model = random_model(CONFIGS["personaplex-7b-v1"], torch.device("cpu"), torch.bfloat16)
    report["build_s"] = time.perf_counter() - started
    report["lm_parameters"] = sum(p.numel() for p in model.lm.parameters())
    report["rss_after_build_gb"] = peak_rss_gb()
    print(f"built {report['lm_parameters'] / 1e9:.2f} B LM parameters in {report['build_s']:.0f} s, "
          f"peak RSS {report['rss_after_build_gb']:.1f} GB", flush=True)

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
            frame = pcm[None, i * FRAME_SIZE:(i + 1) * FRAME_SIZE]
            t = time.perf_counter()
            out = engine.step([SlotMode.LIVE], frame)
            live.append(time.perf_counter() - t)
            assert out.pcm.shape == (1, FRAME_SIZE) and np.isfinite(out.pcm).all()
            texts.append(out.text[0])
    report.update(prefill_steps=len(prefill), prefill_s_median=float(np.median(prefill)) if prefill else None,
                  live_ticks=len(live), live_s=[round(x, 3) for x in live],
                  live_s_median=float(np.median(live)), peak_rss_gb=peak_rss_gb(),
                  total_s=time.perf_counter() - started)
    print(f"live: {len(live)} ticks, {report['live_s_median']:.2f} s each (median; real time needs 0.08 s), "
          f"peak RSS {report['peak_rss_gb']:.1f} GB, texts {texts}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {RESULTS / (args.name + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
