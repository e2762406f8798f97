#!/usr/bin/env python3
"""bench/stack_floor: what the fixed stack alone costs per conversation-second, beside our server.

The CPU target of issue 14 asks for the whole server's CPU per
conversation-second at ≤ 55 % of its baseline.  This run asks how much of
today's cost is ours to cut: it drives, one after the other and with the same
clients, servers that do less and less of a conversation's work:

* ``ours``: ``pplex-trio serve --model echo`` (the load test's server);
* ``ours-inline``: the same with ``--opus-encoder inline``: its Opus encoding in
  its own process, as the floor servers do it, instead of a child process;
* ``quart+codecs``, ``asgi+codecs``: ``bench/_floor_server.py``, a server with no engine, no
  sessions and no metrics that only takes the pages, decodes them (sphn),
  encodes a frame per connection every 80 ms (libopus, complexity 5) and sends
  it and, on 30 % of the ticks, a text message: the design card's stack
  (Trio, hypercorn, wsproto, with and without Quart-Trio's WebSocket wrapper)
  plus the codec work that any server of this protocol does;
* ``asgi+codecs0``: the same with libopus at complexity 0 (its cheapest, and a lower quality);
* ``asgi``: the same without the codecs (the stack alone).

The clients (``_reference_client.converse``) behave like ``bench/load.py
--traffic official`` from the handshake: a 40 ms Ogg page of real speech every
40 ms, reading everything.  The figure is the CPU time of the server's whole process
tree over a steady window, per conversation-second.  Beside it, the audio frames
a client got per second: a server that falls behind (on a host too small for
``--clients``) sends fewer frames and does less work, so its CPU figure is not
comparable with one that kept up (the table says when one fell behind).

Usage (from the repository root)::

    python bench/stack_floor.py --clients 64 --duration 30
    python bench/stack_floor.py --clients 64 --duration 20 --variants ours asgi+codecs --rounds 5
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys
import time

import trio

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import _reference_client as client  # noqa: E402
from _serverproc import ServerProcess  # noqa: E402
from load import encode_pages  # noqa: E402

RESULTS = BENCH / "results"
CONNECT_TIMEOUT = 120.0  # s for every client to be streaming
BASELINE_MS = 8.7  # official traffic, N=64, 2026-12-01 13:03 (docs/BENCHMARKS.md)
FRAMES_PER_S = 12.5  # audio frames a second each client gets from a server that keeps up
KEPT_UP = 0.98  # a server that sent less did less work: its CPU figure is not comparable


def server_command(variant: str, clients: int) -> list[str]:
    if variant in ("ours", "ours-inline"):
        placement = ["--opus-encoder", "inline"] if variant == "ours-inline" else []
        return [
            "-m",
            "pplex_trio",
            "serve",
            "--model",
            "echo:step_ms=20,prompt=12,text_share=0.3",
            "--slots",
            str(clients),
            "--port",
            "0",
            "--queue-size",
            "0",
            *placement,
        ]
    framework, _, codecs = variant.partition("+")  # e.g. "asgi+codecs", or "asgi+codecs0" for complexity 0
    options = ["--codecs"] if codecs else []
    if codecs.removeprefix("codecs"):
        options += ["--complexity", codecs.removeprefix("codecs")]
    return [str(BENCH / "_floor_server.py"), framework, *options]


async def drive(
    server: ServerProcess, clients: int, pages: list[bytes], warmup: float, duration: float
) -> tuple[float, float]:
    """CPU ms of the server tree per conversation-second over the window, once every client is streaming, and
    the audio frames a client got per second in it (:data:`FRAMES_PER_S` when the server kept up)."""
    url = client.chat_url(f"http://{server.address}")
    traces = [client.Trace(i) for i in range(clients)]
    stream_pages = round((CONNECT_TIMEOUT + warmup + duration + 5) / client.PAGE_S)  # the run cancels them sooner
    async with trio.open_nursery() as nursery:
        for trace in traces:
            nursery.start_soon(
                functools.partial(
                    client.converse,
                    url,
                    pages,
                    trace,
                    clock=trio.current_time,
                    stream_pages=stream_pages,
                    wait_timeout=CONNECT_TIMEOUT,
                    drain=0.0,
                )
            )
        with trio.move_on_after(CONNECT_TIMEOUT) as waiting:
            while not all(trace.pages_sent_at or trace.error for trace in traces):
                await trio.sleep(0.05)
        if waiting.cancelled_caught:
            streaming = sum(1 for trace in traces if trace.pages_sent_at)
            raise RuntimeError(f"{streaming} of {clients} clients were streaming after {CONNECT_TIMEOUT:.0f} s")
        if errors := [trace.error for trace in traces if trace.error]:
            raise RuntimeError(f"{len(errors)} client(s) failed, the first: {errors[0]}")
        await trio.sleep(warmup)
        cpu0, start = server.tree_cpu_seconds(), trio.current_time()  # the clients' clock stamps their frames
        await trio.sleep(duration)
        cpu1, end = server.tree_cpu_seconds(), trio.current_time()
        nursery.cancel_scope.cancel()
    frames = sum(1 for trace in traces for at in trace.audio_at if start <= at < end)
    return 1000 * (cpu1 - cpu0) / ((end - start) * clients), frames / ((end - start) * clients)


def summary(rows: list[dict], variants: list[str], floor: str = "asgi+codecs") -> str:
    """A markdown table: each server's median, and its ratio to ``floor`` (the bare stack with the codecs,
    when it ran) round by round, with their median."""
    lines = [
        f"| server | CPU ms per conversation-second (median) | / {floor} (median; each round) | "
        f"audio frames a client got per second (of {FRAMES_PER_S:g}) | of the baseline (8.7) |",
        "|---|---|---|---|---|",
    ]
    measured = [r for r in rows if "cpu_ms_per_conv_s" in r]  # a failed run has an "error" instead
    for variant in variants:
        own = [r for r in measured if r["variant"] == variant]
        ms = [r["cpu_ms_per_conv_s"] for r in own]
        ratios = [
            r["cpu_ms_per_conv_s"] / f["cpu_ms_per_conv_s"]
            for r in own
            for f in measured
            if f["variant"] == floor and f["round"] == r["round"]
        ]
        ratio = f"{statistics.median(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})" if ratios else "-"
        failed = sum(1 for r in rows if r["variant"] == variant and "error" in r)
        note = f" ({failed} run(s) failed)" if failed else ""
        if not ms:
            lines.append(f"| {variant} | failed{note} | - | - | - |")
            continue
        median = statistics.median(ms)
        served = [r["audio_frames_per_s"] for r in own]
        kept_up = sum(1 for x in served if x >= KEPT_UP * FRAMES_PER_S)
        got = f"{statistics.median(served):.2f}" + (
            "" if kept_up == len(served) else f" (fell behind in {len(served) - kept_up} of {len(served)})"
        )
        lines.append(f"| {variant} | {median:.2f}{note} | {ratio} | {got} | {median / BASELINE_MS:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds measured per server")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument(
        "--variants", nargs="+", default=["ours", "quart+codecs", "asgi+codecs", "asgi+codecs0", "asgi"]
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every variant this many times, interleaved: on a host whose speed drifts "
        "from minute to minute, the median of each round's ratio is the figure to trust",
    )
    parser.add_argument("--name", default="stack-floor")
    args = parser.parse_args(argv)
    pages = encode_pages(CONNECT_TIMEOUT + args.warmup + args.duration + 10, 40)
    rows = []
    for round_ in range(args.rounds):
        for variant in args.variants:
            row: dict = {"variant": variant, "clients": args.clients, "round": round_}
            try:
                server = ServerProcess(server_command(variant, args.clients))
                try:
                    ms, served = trio.run(drive, server, args.clients, pages, args.warmup, args.duration)
                    row.update(cpu_ms_per_conv_s=ms, audio_frames_per_s=served)
                finally:
                    server.stop()
            except Exception as exc:  # one bad run (a busy host, a server that died) must not lose the others
                while isinstance(exc, ExceptionGroup):  # a nursery's: name what went wrong inside it
                    exc = exc.exceptions[0]
                row["error"] = f"{type(exc).__name__}: {exc}"
                print(f"round {round_ + 1}: {variant:14s} N={args.clients}  failed: {row['error']}", flush=True)
            else:
                print(
                    f"round {round_ + 1}: {variant:14s} N={args.clients}  {ms:5.2f} ms CPU per "
                    f"conversation-second, {served:5.2f} of {FRAMES_PER_S:g} audio frames a second to each "
                    "client",
                    flush=True,
                )
            rows.append(row)
    print()
    print(summary(rows, args.variants))
    print(f"\nthe target: ≤ {0.55 * BASELINE_MS:.2f} ms (55 % of the baseline)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(
        json.dumps(
            {
                "command": " ".join(["python", "bench/stack_floor.py", *(argv if argv is not None else sys.argv[1:])]),
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "results": rows,
            },
            indent=1,
        )
    )
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
