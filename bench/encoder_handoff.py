#!/usr/bin/env python3
"""bench/encoder_handoff: what a frame's trip to the encoder child costs, beside encoding it in place.

``bench/stack_floor.py`` compares whole servers, and on a shared two-core
host its rounds move by ±10 %: too coarse to see the few per cent the
default placement (``--opus-encoder process``) adds to in-process encoding.
This run takes the network, the sessions and the engine away: ``--streams``
tasks, woken together every 80 ms as by the engine's tick, each encode one
frame of real speech through the server's own encoder pool, and the CPU of
this process and of its encoder child is counted per frame.  Three ways:

* ``none``: the tasks and the tick, no encoding (what the loop costs anyway);
* ``inline``: libopus on the event loop (``--opus-encoder inline``);
* ``process``: the default's child (``ProcessEncoderPool``, no conversation inline).

``process`` minus ``inline`` is the hand-off: the loop's packing, pipe I/O and
wake-ups, and the child's reading and writing.

Usage (from the repository root)::

    python bench/encoder_handoff.py --streams 32 --duration 15 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import trio

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from _serverproc import _cpu_seconds, _descendants  # noqa: E402
from codec import FRAME, speech  # noqa: E402

from pplex_trio.server._encoders import InlineEncoders, ProcessEncoderPool  # noqa: E402

RESULTS = BENCH / "results"
TICK = 0.080
PLACEMENTS = ("none", "inline", "process")


class NoEncoding(InlineEncoders):
    async def encode_many(self, stream, frames):
        return [b"" for _ in frames]


def make_pool(placement: str):
    return {"none": NoEncoding, "inline": InlineEncoders, "process": lambda: ProcessEncoderPool(inline_streams=0)}[
        placement
    ]()


async def measure(placement: str, streams: int, duration: float, warmup: float) -> dict:
    """CPU µs per frame of this process and of its children, and the frames each stream encoded per second."""
    pcm = speech(10.0)
    frames_in_clip = len(pcm) // FRAME
    pool = make_pool(placement)
    encoded = 0
    tick = trio.Event()

    async def stream(index: int) -> None:
        nonlocal encoded
        writer, k = pool.open_stream(), index
        while True:
            await tick.wait()
            at = (k % frames_in_clip) * FRAME
            await pool.encode_many(writer, [pcm[at : at + FRAME]])
            k += 1
            encoded += 1

    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        for index in range(streams):
            nursery.start_soon(stream, index)

        async def clock() -> None:
            nonlocal tick
            deadline = trio.current_time()
            while True:
                deadline += TICK
                await trio.sleep_until(deadline)
                tick, woken = trio.Event(), tick
                woken.set()

        nursery.start_soon(clock)
        await trio.sleep(warmup)
        children = _descendants(os.getpid())
        cpu0 = [_cpu_seconds(pid) for pid in [os.getpid(), *children]]
        frames0, start = encoded, trio.current_time()
        await trio.sleep(duration)
        cpu1 = [_cpu_seconds(pid) for pid in [os.getpid(), *children]]
        frames, seconds = encoded - frames0, trio.current_time() - start
        nursery.cancel_scope.cancel()
    loop_us = 1e6 * (cpu1[0] - cpu0[0]) / frames
    child_us = 1e6 * sum(b - a for a, b in zip(cpu0[1:], cpu1[1:])) / frames
    return {
        "placement": placement,
        "streams": streams,
        "loop_us_per_frame": loop_us,
        "child_us_per_frame": child_us,
        "frames_per_s_per_stream": frames / seconds / streams,
    }


def summary(rows: list[dict]) -> str:
    lines = [
        "| placement | event loop µs/frame | encoder child µs/frame | total (median) | frames a second per stream |",
        "|---|---|---|---|---|",
    ]
    for placement in PLACEMENTS:
        own = [r for r in rows if r["placement"] == placement]
        if not own:
            continue
        loop = statistics.median(r["loop_us_per_frame"] for r in own)
        child = statistics.median(r["child_us_per_frame"] for r in own)
        total = statistics.median(r["loop_us_per_frame"] + r["child_us_per_frame"] for r in own)
        rate = statistics.median(r["frames_per_s_per_stream"] for r in own)
        lines.append(f"| {placement} | {loop:.1f} | {child:.1f} | {total:.1f} | {rate:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per placement")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3, help="the placements in turn, this many times")
    parser.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS))
    parser.add_argument("--name", default="encoder-handoff")
    args = parser.parse_args(argv)
    rows = []
    for round_ in range(args.rounds):
        for placement in args.placements:
            row = trio.run(measure, placement, args.streams, args.duration, args.warmup)
            rows.append({**row, "round": round_})
            print(
                f"round {round_ + 1}: {placement:8s} {row['loop_us_per_frame']:6.1f} µs loop + "
                f"{row['child_us_per_frame']:6.1f} µs child per frame",
                flush=True,
            )
    print()
    print(summary(rows))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(
        json.dumps(
            {
                "command": " ".join(
                    ["python", "bench/encoder_handoff.py", *(argv if argv is not None else sys.argv[1:])]
                ),
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "results": rows,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
