#!/usr/bin/env python3
"""bench/reference: pplex-trio side by side with Kyutai's reference server (moshi 0.2.13).

Serves one tiny checkpoint with both servers and drives them with the same
Moshi-protocol client (``bench/_reference_client.py``): real speech from
``../shared/data``, Ogg Opus pages of 40 ms sent at real-time pace.

* **single conversation**, repeated, the two servers taking turns: time to
  the handshake, handshake to first audio, per-frame turnaround;
* **N simultaneous clients** (2, 4, 8): how many are served at once, each
  client's time to first audio, audio frames per second per client.

The reference (``moshi.server``, aiohttp) runs in its own venv
``bench/.venv-reference``, created on first use (``bench/_reference_env.py``),
through ``bench/_reference_launch.py``, which only makes it run on a CPU.
The checkpoint is ``bench/_reference_checkpoint.py``'s (built into a temporary
folder unless ``--checkpoint``).

Usage (from the repository root)::

    python bench/reference.py                       # the whole comparison, ~7 minutes on a quiet machine
    python bench/reference.py --repeats 1 --clients 2 --duration 6 --load-duration 4   # a quick look

Prints one table with both servers and ``ours/ref`` ratios, and writes
``bench/results/<name>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import pathlib
import platform
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable

import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import _reference_checkpoint as checkpoint  # noqa: E402
import _reference_client as client  # noqa: E402
import _reference_cpu as cpu  # noqa: E402
import _reference_env as refenv  # noqa: E402
import _reference_report as report  # noqa: E402
from _metrics import Histogram, Snapshot, scrape  # noqa: E402
from _serverproc import ServerProcess  # noqa: E402
from load import encode_pages  # noqa: E402

logger = logging.getLogger("bench.reference")
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "bench" / "results"
LAUNCHER = REPO / "bench" / "_reference_launch.py"
_FRAME_HANDLED = re.compile(r"frame handled in ([\d.]+)ms")


# --- the two servers ----------------------------------------------------------------------


def free_port() -> int:
    """A port that was free a moment ago (moshi.server prints the port it was given, not the one bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_reference(args: argparse.Namespace, ckpt: pathlib.Path) -> ServerProcess:
    cmd = [
        str(LAUNCHER),
        "--lm-dtype",
        "float32",
        "--torch-threads",
        str(args.torch_threads),
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        *checkpoint.reference_args(ckpt),
    ]
    return ServerProcess(cmd, python=str(refenv.python(args.reference_venv)), startup_timeout=300)


def start_ours(args: argparse.Namespace, ckpt: pathlib.Path, slots: int) -> ServerProcess:
    cmd = [
        "-m",
        "pplex_trio",
        "serve",
        "--model",
        str(ckpt),
        "--slots",
        str(slots),
        "--device",
        "cpu",
        "--port",
        "0",
        "--queue-size",
        "16",
    ]
    return ServerProcess(cmd, startup_timeout=300, env={"PYTHONPATH": str(REPO)})


@dataclasses.dataclass
class Server:
    side: str
    proc: ServerProcess

    @property
    def url(self) -> str:
        return "http://" + self.proc.address

    def log_mark(self) -> int:
        return len(self.proc.log)

    def frames_handled_ms(self, since: int) -> list[float]:
        """moshi.server logs ``frame handled in X ms`` (encode + LM step + decode + send) per input frame."""
        return [float(m.group(1)) for line in self.proc.log[since:] if (m := _FRAME_HANDLED.search(line))]


# --- scenarios ----------------------------------------------------------------------------


def counters(snapshot: Snapshot, base: Snapshot, at: float) -> client.Counters:
    def delta(name: str) -> float:
        return snapshot.total(name) - base.total(name)

    return client.Counters(
        at=at,
        frames_in=delta("pplex_frames_in_total"),
        silence=delta("pplex_frames_silence_filled_total"),
        skipped=delta("pplex_input_samples_skipped_total"),
        dropped=delta("pplex_frames_dropped_total"),
    )


async def single_conversation(
    server: Server, pages: list[bytes], page_samples: list[int], args: argparse.Namespace
) -> dict:
    """One conversation of ``args.duration`` s; our server's counters are read meanwhile (``client.scrape_times``)."""
    t0 = trio.current_time()
    clock = lambda: trio.current_time() - t0  # noqa: E731
    trace = client.Trace(0)
    snapshots: list[tuple[float, Snapshot]] = []
    mark, cpu0 = server.log_mark(), server.proc.cpu_seconds()

    async def read() -> tuple[float, Snapshot]:
        return clock(), await trio.to_thread.run_sync(scrape, server.url)

    done = trio.Event()
    async with trio.open_nursery() as nursery:
        if server.side == "ours":
            snapshots.append(await read())  # before the conversation: the base of every difference
            nursery.start_soon(client.scrape_while, done, read, snapshots)
        await client.converse(
            client.chat_url(server.url, **checkpoint.SAMPLING_QUERY),
            pages,
            trace,
            clock=clock,
            stream_pages=round(args.duration / client.PAGE_S),
            wait_timeout=30,
            drain=args.drain,
        )
        done.set()
    wall = clock()
    cpu = server.proc.cpu_seconds() - cpu0

    frames = client.complete_frames(trace, page_samples)
    result = {"trace": dataclasses.asdict(trace), "complete_frames": frames, "cpu_percent": 100 * cpu / wall}
    if server.side == "reference":
        mapping = client.reference_frame_map(len(trace.audio_at))
        handled = server.frames_handled_ms(mark)
        result["server_frame_ms_p50"] = client.quantile(handled, 0.5)
        result["outputs_expected"] = frames - 1
    else:
        base = snapshots[0][1]
        series = [counters(s, base, at) for at, s in snapshots]
        mapping = client.ours_frame_map(len(trace.audio_at), series)
        first, last = snapshots[0][1], snapshots[-1][1]
        result["server_tick_engine_ms_p50"] = 1000 * Histogram.between(
            first, last, "pplex_tick_engine_seconds"
        ).quantile(0.5)
        result["server_added_latency_ms_p50"] = 1000 * Histogram.between(
            first, last, "pplex_added_latency_seconds"
        ).quantile(0.5)
        result["counters"] = [dataclasses.asdict(c) for c in series]
        result["ticks_skipped"] = last.total("pplex_ticks_skipped_total") - first.total("pplex_ticks_skipped_total")
        result["frames_dropped"] = series[-1].dropped
    turn = client.turnarounds(trace, mapping, page_samples)
    result.update(
        mapped_outputs=sum(m is not None for m in mapping),
        turnaround_ms=[1000 * t for t in turn],
        handshake_ms=1000 * (trace.handshake_at - trace.connect_at),
        first_audio_ms=1000 * (trace.audio_at[0] - trace.handshake_at) if trace.audio_at else math.nan,
    )
    return result


async def warm_up(server: Server, pages: list[bytes]) -> None:
    """One short conversation, not measured: first-call costs (lazy inits, allocator) are not the comparison."""
    trace = client.Trace(-1)
    await client.converse(
        client.chat_url(server.url, **checkpoint.SAMPLING_QUERY),
        pages,
        trace,
        clock=trio.current_time,
        stream_pages=50,
        wait_timeout=30,
        drain=0.3,
    )
    if trace.error or not trace.audio_at:
        raise RuntimeError(f"{server.side} server failed its warm-up conversation: {trace.error or 'no audio'}")


async def many_clients(server: Server, n: int, pages: list[bytes], args: argparse.Namespace) -> dict:
    """``n`` clients connect at once; each streams ``args.load_duration`` s once it has its handshake."""
    t0 = trio.current_time()
    clock = lambda: trio.current_time() - t0  # noqa: E731
    traces = [client.Trace(i) for i in range(n)]
    cpu0, mark = server.proc.cpu_seconds(), server.log_mark()
    before = await trio.to_thread.run_sync(scrape, server.url) if server.side == "ours" else None
    url = client.chat_url(server.url, **checkpoint.SAMPLING_QUERY)
    async with trio.open_nursery() as nursery:
        for trace in traces:
            nursery.start_soon(
                functools.partial(
                    client.converse,
                    url,
                    pages,
                    trace,
                    clock=clock,
                    stream_pages=round(args.load_duration / client.PAGE_S),
                    wait_timeout=args.wait_timeout,
                    drain=args.drain,
                )
            )
    wall = clock()
    result = {
        "clients": n,
        "traces": [dataclasses.asdict(t) for t in traces],
        "wall_s": wall,
        "cpu_percent": 100 * (server.proc.cpu_seconds() - cpu0) / wall,
    }
    if before is not None:
        after = await trio.to_thread.run_sync(scrape, server.url)
        result["server_step_ms_p50"] = 1000 * Histogram.between(before, after, "pplex_tick_engine_seconds").quantile(
            0.5
        )
        for key, name in (
            ("ticks_skipped", "pplex_ticks_skipped_total"),
            ("frames_dropped", "pplex_frames_dropped_total"),
        ):
            result[key] = after.total(name) - before.total(name)
    else:
        result["server_step_ms_p50"] = client.quantile(server.frames_handled_ms(mark), 0.5)
    return result


# --- driving it -------------------------------------------------------------------------------


def run_scenario(fn: Callable, *args) -> dict:
    return trio.run(functools.partial(fn, *args))


class Scenarios:
    """Runs scenarios one at a time, each after a quiet moment, noting the other processes' CPU use.

    A scenario during which other processes used ``--busy-limit`` cores or
    more is run again (``--retries`` times at most); the last try counts
    whatever happened, and the discarded tries are kept in the result.
    """

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.servers: list[Server] = []
        self.meter = cpu.CpuMeter(lambda: [s.proc for s in self.servers])
        self.retried = 0

    def run(self, fn: Callable, server: Server, *args) -> dict:
        discarded: list[float] = []
        while True:
            quiet = self.meter.wait_quiet(self.args.quiet_below, self.args.quiet_wait)
            before = self.meter.sample()
            result = run_scenario(fn, server, *args)
            result["other_cores"] = cpu.CpuMeter.other_cores(before, self.meter.sample())
            result["other_cores_before"] = quiet
            if result["other_cores"] < self.args.busy_limit or len(discarded) >= self.args.retries:
                result["discarded_tries_other_cores"] = discarded
                return result
            logger.warning("other processes used %.2f cores during it: running it again", result["other_cores"])
            discarded.append(result["other_cores"])
            self.retried += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=20.0, help="speech per single conversation, s (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="single conversations per server (default 3)")
    parser.add_argument("--clients", default="2,4,8", help="simultaneous clients, comma-separated (default 2,4,8)")
    parser.add_argument(
        "--load-duration", type=float, default=8.0, help="speech each simultaneous client streams, s (default 8)"
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        default=None,
        help="how long a client waits for its handshake, s (default: long enough for the "
        "reference to serve every client in turn)",
    )
    parser.add_argument("--drain", type=float, default=1.0, help="seconds a client listens after its last page")
    parser.add_argument(
        "--our-slots", type=int, default=0, help="--slots of our server; 0 (default): as many as the scenario's clients"
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="the reference's torch threads (default 1, what ours uses for a small model on CPU)",
    )
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=0.25,
        help="before each scenario, wait until other processes use fewer cores than this (default 0.25)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=180.0,
        help="longest such wait per scenario, s; then it measures anyway (default 180)",
    )
    parser.add_argument(
        "--busy-limit",
        type=float,
        default=0.5,
        help="run a scenario again if other processes used this many cores during it (default 0.5)",
    )
    parser.add_argument("--retries", type=int, default=2, help="how many times at most (default 2)")
    parser.add_argument("--checkpoint", type=pathlib.Path, help="a checkpoint folder made by _reference_checkpoint")
    parser.add_argument("--reference-venv", type=pathlib.Path, default=refenv.VENV)
    parser.add_argument("--name", default="reference", help="file name stem under bench/results/")
    parser.add_argument(
        "--report",
        type=pathlib.Path,
        metavar="JSON",
        help="measure nothing: print the table of a results file again and redraw its plot",
    )
    args = parser.parse_args(argv)
    if args.report:
        data = json.loads(args.report.read_text())
        print(report.render(data))
        report.plot(data, args.report.with_suffix(".png"))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    clients = [int(n) for n in args.clients.split(",") if n.strip()]
    if args.wait_timeout is None:
        args.wait_timeout = max(clients, default=1) * (args.load_duration + args.drain + 3) + 30

    versions = refenv.ensure(args.reference_venv)
    logger.info("reference venv: moshi torch aiohttp sphn numpy = %s", versions)
    with tempfile.TemporaryDirectory(prefix="bench-reference-") as tmp:
        ckpt = args.checkpoint or checkpoint.build(pathlib.Path(tmp) / "tiny", DATA / "speech_assistant.wav")
        if not (ckpt / checkpoint.MOSHI_CONFIG).exists():
            checkpoint.write_moshi_config(ckpt)
        data = measure(args, ckpt, clients)
    data["reference_venv_versions"] = dict(zip(("moshi", "torch", "aiohttp", "sphn", "numpy"), versions.split()))
    data["command"] = " ".join(["python", "bench/reference.py", *(argv if argv is not None else sys.argv[1:])])

    print(report.render(data))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / args.name
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1, allow_nan=True))
    report.plot(data, stem.with_suffix(".png"))
    print(f"\nwrote {stem.with_suffix('.json').relative_to(REPO)} and {stem.with_suffix('.png').relative_to(REPO)}")
    errors = [e for side in report.SIDES for e in data["single"][side]["errors"]]
    errors += [e for side in report.SIDES for s in data["many"][side].values() for e in s["errors"]]
    for error in errors:
        logger.warning("client error: %s", error)
    return 0


def relative(value: object) -> object:
    """A path inside the repository as the repository-relative path (results files name no machine's folders)."""
    if isinstance(value, pathlib.Path) and value.resolve().is_relative_to(REPO):
        return value.resolve().relative_to(REPO)
    return value


def measure(args: argparse.Namespace, ckpt: pathlib.Path, clients: list[int]) -> dict:
    """Run every scenario; the two servers take turns, the first one alternating."""
    pages = encode_pages(max(args.duration, args.load_duration) + 2, 40)
    page_samples = client.decoded_samples(pages)
    data: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_before": os.getloadavg(),
        "checkpoint_spec": checkpoint.spec().name,
        "single_runs": {side: [] for side in report.SIDES},
        "many_runs": {side: {} for side in report.SIDES},
        "args": {k: str(relative(v)) for k, v in vars(args).items()},
    }
    scenarios = Scenarios(args)
    reference = Server("reference", start_reference(args, ckpt))
    logger.info("reference server at %s", reference.url)
    try:
        run_scenario(warm_up, reference, pages)
        for k, n in enumerate([1, *clients]):
            ours = Server("ours", start_ours(args, ckpt, args.our_slots or n))
            scenarios.servers = [reference, ours]
            try:
                logger.info("our server (--slots %s) at %s", args.our_slots or n, ours.url)
                run_scenario(warm_up, ours, pages)
                for rep in range(args.repeats if n == 1 else 1):
                    order = (reference, ours) if (rep + k) % 2 == 0 else (ours, reference)
                    for server in order:
                        if n == 1:
                            logger.info("single conversation %d/%d: %s", rep + 1, args.repeats, server.side)
                            data["single_runs"][server.side].append(
                                scenarios.run(single_conversation, server, pages, page_samples, args)
                            )
                        else:
                            logger.info("%d simultaneous clients: %s", n, server.side)
                            data["many_runs"][server.side][str(n)] = scenarios.run(many_clients, server, n, pages, args)
            finally:
                scenarios.servers = [reference]
                ours.proc.stop()
    finally:
        reference.proc.stop()
    data["load_after"] = os.getloadavg()
    data["scenarios_rerun"] = scenarios.retried
    data["single"] = {side: report.summarize_single(data["single_runs"][side]) for side in report.SIDES}
    data["many"] = {
        side: {n: report.summarize_many(run, args.load_duration) for n, run in data["many_runs"][side].items()}
        for side in report.SIDES
    }
    ref_runs, our_runs = data["single_runs"]["reference"], data["single_runs"]["ours"]
    data["server_side"] = {
        "reference_frame_ms": client.quantile([r["server_frame_ms_p50"] for r in ref_runs], 0.5),
        "ours_tick_engine_ms": client.quantile([r["server_tick_engine_ms_p50"] for r in our_runs], 0.5),
        "ours_added_latency_ms": client.quantile([r["server_added_latency_ms_p50"] for r in our_runs], 0.5),
    }
    return data


if __name__ == "__main__":
    sys.exit(main())
