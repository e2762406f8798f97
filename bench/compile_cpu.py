#!/usr/bin/env python3
"""bench/compile_cpu: the engine tick through ``torch.compile`` (inductor) on this CPU, against the eager tick.

Usage (from the repository root)::

    python bench/compile_cpu.py                      # the golden checkpoint, 2 rows, 10 frames
    python bench/compile_cpu.py --frames 40 --json bench/results/compile-cpu.json

Builds ``PersonaPlexEngine(compile=True)`` on the golden checkpoint (a minute
or more of inductor's C++ compile here), keeps the compiled tick whatever the
check at load says (the check's verdict is recorded), then drives one sampled
and one greedy row through their prompts and ``--frames`` live frames of noise,
compiled and eager from the same state. Prints the compile time, the share of
tokens that agree, the first frame that differs and the check's verdict.

Exit status 1 when the check at load and the tokens disagree about whether the
compiled tick is exact (the check passed but tokens differ, or the reverse), or
when the compiled tick's audio is not finite, or when half the tokens or more differ: the correctness that
``tests/model/test_engine_compile.py`` checks cheaply with stand-ins for
``torch.compile``, here with the real one. Figures: docs/BENCHMARKS.md,
*Kernels per tick*.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import warnings

import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from _helpers.engine_runs import drive  # noqa: E402
from pplex_trio.engine import _device_tick  # noqa: E402
from pplex_trio.engine._personaplex import PersonaPlexEngine  # noqa: E402
from pplex_trio.model import load_model  # noqa: E402

GOLDEN = REPO.parent / "shared" / "golden" / "tiny-public"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(GOLDEN), help="a checkpoint (default: the golden one)")
    parser.add_argument("--frames", type=int, default=10, help="live frames compared (default 10)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as the tests)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", "Torchinductor does not support code generation for complex operators")
    model = load_model(args.model)

    checked: list[str | None] = []
    differs = _device_tick.DeviceTick._differs

    def keep_it(tick, fn):  # the check's verdict kept, the compiled tick kept to measure it
        checked.append(differs(tick, fn))
        return None

    _device_tick.DeviceTick._differs = keep_it  # type: ignore[method-assign]
    start = time.perf_counter()
    compiled = PersonaPlexEngine(model, 2, compile=True)
    compile_s = time.perf_counter() - start
    _device_tick.DeviceTick._differs = differs  # type: ignore[method-assign]
    if compiled.tick_path != "compiled" or len(checked) != 1:
        print(f"torch.compile did not give a compiled tick: tick_path={compiled.tick_path}", file=sys.stderr)
        return 1

    got, want = drive(compiled, args.frames), drive(PersonaPlexEngine(model, 2), args.frames)
    same = got[0] == want[0]
    agreement = float(same.mean())
    first = next((i for i, frame in enumerate(same) if not frame.all()), None)
    verdict = checked[0] or "agrees"
    figures = {
        "model": args.model,
        "torch": torch.__version__,
        "threads": args.threads,
        "frames": args.frames,
        "compile_s": round(compile_s, 1),
        "token_agreement": agreement,
        "first_frame_that_differs": first,
        "check_at_load": verdict,
    }
    print(
        f"torch {torch.__version__}, {args.threads} thread(s): compiled in {compile_s:.0f} s; "
        f"{agreement:.1%} of the tokens agree over {args.frames} frames of 2 rows, "
        f"first difference in frame {first}; the check at load: {verdict}"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    problems = []
    if (checked[0] is None) != (agreement == 1.0):
        problems.append("the check at load and the tokens disagree about whether the compiled tick is exact")
    if not np.isfinite(got[1]).all():
        problems.append("the compiled tick's audio is not finite")
    if agreement <= 0.5:
        problems.append(f"only {agreement:.1%} of the tokens agree: more than inductor's rounding")
    for problem in problems:
        print("FAILED:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
