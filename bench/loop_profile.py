"""bench/loop_profile: where the server's event loop spends its time under load.

Starts ``pplex-trio serve --model echo --slots N``, drives it with
``bench/load.py --url ... --clients N``, and samples the server with py-spy
(``pip install py-spy``; it needs ptrace rights over the child, as root or
with ``kernel.yama.ptrace_scope=0``).  Each sample of the main thread (the
Trio event loop) is put in the bucket of its innermost frame that has one,
skipping Trio's own frames, so a socket send inside hypercorn counts as
hypercorn's, and
a protocol's ``decode`` (for ``/api/chat`` sphn's native decoder, invisible to
py-spy without ``--native``) counts as decoding.  Only stacks that are Trio all the
way down count as the scheduler's.  Idle samples (the loop waiting in epoll)
are counted apart: the loop's busy share is what limits how many
conversations one process holds in real time.

Usage (from the repository root)::

    python bench/loop_profile.py --clients 48 --duration 20
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _serverproc import ServerProcess  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent

IDLE = ("get_events (trio/_core/_io_epoll.py",)
# (bucket, markers), tried in order on each frame from the innermost out.
BUCKETS = [
    # The protocols' decode (sphn's native Opus decoder is invisible to py-spy without --native).
    ("input decode (sphn Opus; Realtime base64, G.711)", (".decode_loop", "Protocol.decode")),
    ("metrics (prometheus-client)", ("prometheus_client",)),
    ("encoder child I/O (pack, pipe, answers)", ("pplex_trio/codec/",)),
    ("WebSocket framing (wsproto)", ("wsproto/",)),
    ("HTTP server (hypercorn, h11)", ("hypercorn/", "h11/")),
    ("Quart websocket layer", ("quart/", "quart_trio/")),
    ("engine actor and input framing", ("pplex_trio/engine/",)),
    # The guarded transport under hypercorn: its socket reads and writes, the inbound guard.
    (
        "transport: socket I/O and the guard",
        (
            "pplex_trio/server/transport/_transport.py",
            "pplex_trio/server/transport/_guarded_stream.py",
            "pplex_trio/protocol/_ws_guard.py",
        ),
    ),
    ("sessions: receive, encode, send loops", ("pplex_trio/server/",)),
    ("our protocol codecs and channels", ("pplex_trio/protocol/", "pplex_trio/_channel")),
]
SCHEDULER = "Trio scheduler alone"


def bucket_of(frames: list[str]) -> str:
    if frames and any(marker in frames[-1] for marker in IDLE):
        return "idle (epoll wait)"
    # Only what runs inside Trio's run loop belongs to a task.
    starts = [i for i, frame in enumerate(frames) if "run (trio/_core/_run.py" in frame]
    if starts:
        frames = frames[starts[-1] + 1 :]
    seen_other = False
    for frame in reversed(frames):  # innermost first; a frame of no bucket defers to its caller
        if "(trio/" in frame:
            continue  # Trio's own frames count for whoever called them
        for name, markers in BUCKETS:
            if any(marker in frame for marker in markers):
                return name
        seen_other = True
    return "other" if seen_other else SCHEDULER


def summarize(raw: str) -> tuple[collections.Counter[str], int]:
    """py-spy's ``--format raw`` (collapsed stacks: ``thread;frame;frame count``) → samples per bucket."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if "MainThread" not in frames[0]:
            continue
        counts[bucket_of(frames[1:])] += int(count)
        total += int(count)
    return counts, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=48)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds sampled")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    parser.add_argument("--traffic", default="mixed", choices=("mixed", "official"), help="as bench/load.py")
    parser.add_argument("--save-raw", type=pathlib.Path, help="also keep py-spy's collapsed stacks here")
    args = parser.parse_args(argv)

    text_share = 0.3 if args.traffic == "official" else 1.0
    server = ServerProcess(
        [
            "-m",
            "pplex_trio",
            "serve",
            "--model",
            f"echo:step_ms=20,text_share={text_share:g}",
            "--slots",
            str(args.clients),
            "--port",
            "0",
            "--queue-size",
            "0",
        ]
    )
    url = f"http://{server.address}"
    with tempfile.TemporaryDirectory() as tmp:  # the load's results and py-spy's stacks are not kept
        load = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "load.py"),
                "--url",
                url,
                "--clients",
                str(args.clients),
                "--duration",
                str(args.duration + 10),
                "--traffic",
                args.traffic,
                "--results",
                tmp,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(8)  # connect, run the system prompts, settle
            out = pathlib.Path(tmp) / "profile.txt"
            subprocess.run(
                [
                    args.py_spy,
                    "record",
                    "--pid",
                    str(server.pid),
                    "--duration",
                    str(int(args.duration)),
                    "--rate",
                    str(args.rate),
                    "--format",
                    "raw",
                    "--threads",
                    "--nonblocking",
                    "--idle",
                    "--output",
                    str(out),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            raw = out.read_text()
            if args.save_raw is not None:
                args.save_raw.write_text(raw)
            counts, total = summarize(raw)
        finally:
            load.wait(timeout=120)
            server.stop()
    if not total:
        print("no samples of the main thread (does py-spy have ptrace rights?)")
        return 1
    idle = counts.pop("idle (epoll wait)", 0)
    busy = total - idle
    print(f"# main thread (event loop), {args.clients} conversations, {args.duration:g} s, {total} samples")
    print(f"# busy {100 * busy / total:.0f}% of the time; shares of the busy time:")
    for name, count in counts.most_common():
        print(f"{name:42s} {100 * count / busy:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
