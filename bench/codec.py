#!/usr/bin/env python3
"""bench/codec: what Opus costs per 80 ms frame, and whether it releases the GIL.

Usage (from the repository root)::

    python bench/codec.py [--seconds 20] [--threads 2]

For each codec path it encodes (or decodes) real speech frame by frame and
prints the wall and CPU time per frame, first on one thread, then the same
total work split over ``--threads`` threads.  If the threaded run's wall time
drops close to 1/threads of the single-thread time, the codec releases the
GIL; if it stays the same, it holds it (and would block the event loop).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import threading
import time

import numpy as np
import sphn

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from _helpers.ogg import split_pages  # noqa: E402
from pplex_trio.codec._libopus import LibopusWriter  # noqa: E402

SR, FRAME = 24_000, 1920


def speech(seconds: float) -> np.ndarray:
    pcm, _ = sphn.read(str(REPO.parent / "shared" / "data" / "speech_assistant.wav"))
    return np.ascontiguousarray(pcm[0, : int(seconds * SR) // FRAME * FRAME])


def timed(work, streams: int, threads: int) -> tuple[float, float]:
    """Run work(stream_index) for every stream, spread over `threads`; (wall, cpu) seconds."""
    groups = [list(range(k, streams, threads)) for k in range(threads)]

    def run(group):
        for index in group:
            work(index)

    wall, cpu = time.perf_counter(), time.process_time()
    pool = [threading.Thread(target=run, args=(g,)) for g in groups]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", type=int, default=4, help="independent streams (one encoder each)")
    args = parser.parse_args()
    pcm = speech(args.seconds)
    frames = [pcm[i : i + FRAME] for i in range(0, pcm.size, FRAME)]
    encoded = [sphn.OpusStreamWriter(SR).append_pcm(f) for f in frames[:1]]  # warm up
    writer = sphn.OpusStreamWriter(SR)
    pages = [p for f in frames for p in split_pages(writer.append_pcm(f))]
    del encoded

    def sphn_encode(_):
        w = sphn.OpusStreamWriter(SR)
        for f in frames:
            w.append_pcm(f)

    def libopus_encode(_):
        w = LibopusWriter()
        for f in frames:
            w.append_pcm(f)

    def sphn_decode(_):
        r = sphn.OpusStreamReader(SR)
        for p in pages:
            r.append_bytes(p)

    total_frames = len(frames) * args.streams
    print(f"{args.streams} streams x {len(frames)} frames of real speech; per-frame figures in ms\n")
    print(f"{'path':<16} {'1 thread wall':>14} {'cpu':>8} {f'{args.threads} threads wall':>16} {'speed-up':>9}  GIL")
    for name, work in (("sphn encode", sphn_encode), ("libopus encode", libopus_encode), ("sphn decode", sphn_decode)):
        w1, c1 = timed(work, args.streams, 1)
        wn, _ = timed(work, args.streams, args.threads)
        speedup = w1 / wn
        verdict = "released" if speedup > 1 + 0.5 * (args.threads - 1) else "held"
        print(
            f"{name:<16} {1000 * w1 / total_frames:>14.3f} {1000 * c1 / total_frames:>8.3f} "
            f"{1000 * wn / total_frames:>16.3f} {speedup:>8.2f}x  {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
