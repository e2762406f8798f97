"""bench/soak: conversations that churn for a long time, leaving in every way; does anything leak?

Usage (from the repository root)::

    python bench/soak.py --clients 32 --duration 1800 --name soak-32-30min   # 30 minutes, 32 at a time
    python bench/soak.py --clients 6 --duration 50 --warmup 20              # the CI check's size

Starts ``pplex-trio serve --model echo`` with fewer slots than clients (so
some wait in the queue), a short ``--client-timeout`` and a short ``--resume-seconds`` (a dropped
call pauses, holding its slot, then is let go).  Each client loops:
connect (raw or Moshi, at random), talk 2-20 s at real-time pace, and leave
in one of the ways a real network has: a clean close, a TCP reset, a reset
while queued, a reset while its system prompt runs, or it stops reading and
leaves the server to give up on it; or, raw, it drops mid-call (a reset),
comes back within the window with the token of its ``ready``, resumes the
call and talks on to a clean close.  A well-behaved raw conversation (clean
close, a resumed one's too) checks that every frame it sent came back.

Beside them (``--steady``, on by default) one raw conversation lasts the whole
run: it streams quiet noise (``--steady-db``, -50 dBFS: below the speech
threshold, so the server may take it for a pause) at real time, each frame
numbered in its first sample, and counts its frames back (the echo returns
every one).  Others misbehaving must cost it nothing: a frame it misses, out
of order or twice makes the run fail (exit status 1).

Every few seconds it samples the server from ``/proc`` (RSS of the server and
its encoder child, open file descriptors, threads) and ``/metrics`` (Trio
tasks).  At the end (all clients gone) it reports RSS growth after the
warm-up and the steady RSS (the median over the run's second half), fds,
threads and tasks at the start and end, slots free, frames lost by the
well-behaved conversations and by the steady one, where the server left
frames out (``pplex_frames_dropped_total`` by reason, silence skipped to catch
up, ticks fed silence), and writes JSON and a PNG plot of RSS and fds over
time to ``bench/results/NAME.*``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import os
import pathlib
import random
import socket
import sys
import time
import urllib.request

import numpy as np
import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from _serverproc import ServerProcess  # noqa: E402

from _helpers.bad_client import BadClient  # noqa: E402

logger = logging.getLogger("bench.soak")
FRAME = 1920
RESULTS = REPO / "bench" / "results"
EXITS = ("clean", "clean", "reset", "mid_queue", "mid_prefill", "stop_reading", "resume")
PATHS = {"raw": "/v1/audio/duplex", "moshi": "/api/chat?voice_prompt=NATF0.pt"}
CLIENT_TIMEOUT = 5.0
RESUME_SECONDS = 2.0  # a dropped call is paused this long (--resume-seconds), then let go: both within the churn
STEADY_TAG = 2**20  # the steady conversation's frame n starts with the sample n / STEADY_TAG


@dataclasses.dataclass
class Tally:
    conversations: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    checked: int = 0  # well-behaved raw conversations whose every frame was checked
    frames_sent: int = 0
    frames_lost: int = 0
    failures: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    resumed: int = 0  # dropped calls resumed with their token (then talked on to a clean close)


def moshi_pages(seconds: float) -> list[bytes]:
    import sphn

    from _helpers import ogg

    writer = sphn.OpusStreamWriter(24000)
    tone = (0.2 * np.sin(2 * np.pi * 220 * np.arange(int(seconds * 24000)) / 24000)).astype(np.float32)
    return [
        p
        for i in range(0, tone.size - FRAME + 1, FRAME)
        for p in ogg.split_pages(writer.append_pcm(tone[i : i + FRAME]))
    ]


async def read_until_live(client: BadClient, ready: dict | None = None) -> str:
    """Read until the call is live, queued or waiting (a raw ``ready`` is kept in ``ready``); an ``error``
    raises."""
    while True:
        message = await client.receive(timeout=60)
        if message == b"\x00":
            return "live"
        if isinstance(message, str):
            event = json.loads(message)
            if event["type"] == "ready":
                (ready if ready is not None else {}).update(event)
                return "live"
            if event["type"] == "queued":
                return "queued"
            if event["type"] == "error":
                raise RuntimeError(event.get("message", event))
        elif message == b"\x06":
            return "waiting"


async def conversation(
    port: int, protocol: str, exit: str, talk: float, pages: list[bytes], tally: Tally, resume: str | None = None
) -> None:
    """One client's call, left by ``exit``; ``resume``: a dropped call's token, which this connection resumes."""
    client = await BadClient.connect(port, PATHS[protocol], rcvbuf=4096 if exit == "stop_reading" else None)
    ready: dict = {}
    try:
        if protocol == "raw":
            await client.send(json.dumps({"type": "open", **({"resume": resume} if resume else {})}))
        if exit in ("mid_queue", "mid_prefill"):
            if exit == "mid_prefill":
                await trio.sleep(0.2)
            else:
                await read_until_live(client)
            return  # the finally resets it, wherever it stands
        while await read_until_live(client, ready) != "live":
            pass
        sign = 1.0
        if resume is not None:
            assert ready.get("resumed") is True, ready
            tally.resumed += 1
            sign = -1.0  # (its frames are told from the dropped connection's last ones, which may come first)
        sent: list[float] = []
        echoed: list[float] = []
        done = trio.Event()

        async def send() -> None:
            deadline = trio.current_time()
            period = 0.08 if protocol == "raw" else 0.04  # a raw frame, or a Moshi page of 40 ms
            k = 0
            while k * period < talk:
                if protocol == "raw":
                    value = sign * (len(sent) + 1) / 4096
                    sent.append(value)
                    await client.send(np.full(FRAME, value, "<f4").tobytes())
                else:
                    await client.send(b"\x01" + pages[k % len(pages)])
                deadline += period
                k += 1
                await trio.sleep_until(deadline)

        async def receive() -> None:
            while not done.is_set():
                message = await client.receive(timeout=30)
                if isinstance(message, bytes) and protocol == "raw" and len(message) == FRAME * 4:
                    first = float(np.frombuffer(message, "<f4")[0])
                    if first:
                        echoed.append(first)
                elif isinstance(message, str) and json.loads(message)["type"] == "done":
                    return

        async with trio.open_nursery() as nursery:
            if exit != "stop_reading":
                nursery.start_soon(receive)
            await send()
            if exit == "stop_reading":
                await trio.sleep(CLIENT_TIMEOUT + 3)  # the server gives up on it meanwhile
                return

            if exit == "clean" and protocol == "raw":
                await client.send(np.zeros(FRAME, "<f4").tobytes())  # pushes the echo's last frame out
                await client.send(json.dumps({"type": "close"}))  # the receiver ends at "done"
            else:
                done.set()
                nursery.cancel_scope.cancel()
        if exit == "clean" and protocol == "raw":
            tally.checked += 1
            tally.frames_sent += len(sent)
            tally.frames_lost += len(set(sent) - set(echoed))
    finally:
        client.reset()
    if exit == "resume":  # it dropped mid-call (the reset above): back within the window, it talks on and closes
        await trio.sleep(RESUME_SECONDS / 4)  # (the outage)
        await conversation(port, "raw", "clean", min(talk, 3.0), pages, tally, resume=ready["resume"])


async def churner(port: int, end: float, rng: random.Random, pages: list[bytes], tally: Tally) -> None:
    while trio.current_time() < end:
        protocol, exit = rng.choice(["raw", "moshi"]), rng.choice(EXITS)
        protocol = "raw" if exit == "resume" else protocol  # (the raw protocol's token resumes a call)
        talk = min(rng.uniform(2, 20), max(0.5, end - trio.current_time()))
        tally.conversations[exit] += 1
        try:
            await conversation(port, protocol, exit, talk, pages, tally)
        except* Exception as group:  # a soak must not end on one client's surprise: count it, go on
            if exit in ("clean", "resume"):  # the others leave by breaking the rules: errors are theirs to expect
                first = group.exceptions[0]
                tally.failures[f"{protocol} {exit}: {type(first).__name__}: {first}"[:120]] += 1


@dataclasses.dataclass
class Steady:
    """The conversation that lasts the whole run: frames numbered 1, 2, ... sent, and the numbers echoed."""

    sent: int = 0
    echoed: list[int] = dataclasses.field(default_factory=list)
    ended: str = ""  # "done" when the server answered its close, else what went wrong

    def report(self) -> dict:
        back = set(self.echoed)
        return {
            "frames_sent": self.sent,
            "frames_back": len(back & set(range(1, self.sent + 1))),
            "frames_lost": self.sent - len(back & set(range(1, self.sent + 1))),
            "duplicates": len(self.echoed) - len(back),
            "in_order": self.echoed == sorted(self.echoed),
            "exact": self.ended == "done" and self.echoed == list(range(1, self.sent + 1)),
            "ended": self.ended,
        }


async def steady_conversation(port: int, seconds: float, level_db: float, steady: Steady) -> None:
    """A raw conversation that streams noise at real time for ``seconds`` and counts its frames back.

    The noise is at ``level_db`` dBFS RMS; its frame number n is its first sample, n / 2**20 (exact in
    float32, and too small to lift a quiet frame above the speech threshold)."""
    rng = np.random.default_rng(0)
    level = 10 ** (level_db / 20)
    client = await BadClient.connect(port, PATHS["raw"])
    try:
        await client.send(json.dumps({"type": "open"}))
        while await read_until_live(client) != "live":
            pass

        async def receive() -> None:
            while True:
                message = await client.receive(timeout=30)
                if isinstance(message, bytes) and len(message) == FRAME * 4:
                    number = round(float(np.frombuffer(message, "<f4")[0]) * STEADY_TAG)
                    if number:
                        steady.echoed.append(number)
                elif isinstance(message, str) and json.loads(message)["type"] == "done":
                    steady.ended = "done"
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            deadline = trio.current_time()
            while steady.sent * 0.08 < seconds:
                frame = (level * rng.standard_normal(FRAME)).astype("<f4")
                steady.sent += 1
                frame[0] = steady.sent / STEADY_TAG
                await client.send(frame.tobytes())
                deadline += 0.08
                await trio.sleep_until(deadline)
            await client.send(np.zeros(FRAME, "<f4").tobytes())  # pushes the echo's last frame out
            await client.send(json.dumps({"type": "close"}))
    except Exception as error:  # reported, not raised: the churn goes on and the summary tells
        steady.ended = f"{type(error).__name__}: {error}"[:200]
    finally:
        client.reset()


def proc_sample(pid: int) -> dict:
    """RSS (server plus its children), fds and threads of the server, from /proc."""

    def rss_kb(p: int) -> int:
        try:
            with open(f"/proc/{p}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return 0

    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return {
        "rss_mb": (rss_kb(pid) + sum(rss_kb(c) for c in children)) / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": threads,
    }


def http_get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.read().decode()


def drop_counters(metrics: str) -> dict:
    """``pplex_frames_dropped_total`` by reason, and the silence skipped to catch up, from /metrics."""
    counters = {}
    for line in metrics.splitlines():
        for prefix in (
            "pplex_frames_dropped_total{",
            "pplex_silence_skipped_seconds_total{",
            "pplex_frames_silence_filled_total ",
            "pplex_ticks_skipped_total ",
        ):
            if line.startswith(prefix):
                counters[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return counters


def resume_counters(metrics: str) -> dict:
    """``pplex_resumes_total`` by outcome, from /metrics."""
    prefix = 'pplex_resumes_total{outcome="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(prefix)
    }


def server_sample(server: ServerProcess, port: int, started: float) -> dict:
    sample = proc_sample(server.pid)
    metrics = http_get(port, "/metrics")
    tasks = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("pplex_trio_tasks "))
    health = json.loads(http_get(port, "/health"))
    return {
        "t": round(time.monotonic() - started, 1),
        **sample,
        "tasks": int(tasks),
        "slots_free": health["slots_free"],
        "sessions": health["sessions"],
        "queued": health["queued"],
        "drops": drop_counters(metrics),
        "resumes": resume_counters(metrics),
    }


async def sampler(server: ServerProcess, port: int, started: float, samples: list[dict], every: float) -> None:
    while True:
        samples.append(await trio.to_thread.run_sync(server_sample, server, port, started))
        await trio.sleep(every)


async def run(
    args: argparse.Namespace, server: ServerProcess, port: int, steady: Steady
) -> tuple[list[dict], Tally, dict, dict]:
    pages = moshi_pages(4.0)
    tally = Tally()
    samples: list[dict] = []
    started = time.monotonic()
    idle_before = await trio.to_thread.run_sync(server_sample, server, port, started)
    end = trio.current_time() + args.duration
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler, server, port, started, samples, args.every)
        async with trio.open_nursery() as clients:
            if args.steady:
                clients.start_soon(steady_conversation, port, args.duration, args.steady_db, steady)
            for i in range(args.clients):
                clients.start_soon(churner, port, end, random.Random(args.seed + i), pages, tally)
                await trio.sleep(0.1)
        # The server lets go of the last ones it gave up on, and their paused slots' resume windows lapse.
        await trio.sleep(CLIENT_TIMEOUT + RESUME_SECONDS + 2)
        nursery.cancel_scope.cancel()
    idle_after = await trio.to_thread.run_sync(server_sample, server, port, started)
    return samples, tally, idle_before, idle_after


def summarize(
    args: argparse.Namespace, samples: list[dict], tally: Tally, before: dict, after: dict, steady: Steady
) -> dict:
    warm = [s for s in samples if s["t"] >= args.warmup]
    rss_warm = warm[0]["rss_mb"] if warm else before["rss_mb"]
    rss_peak = max(s["rss_mb"] for s in samples)
    second_half = [s["rss_mb"] for s in samples if s["t"] >= args.duration / 2] or [rss_peak]
    return {
        "clients": args.clients,
        "slots": args.slots,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "conversations": dict(tally.conversations),
        "well_behaved_checked": tally.checked,
        "frames_sent_checked": tally.frames_sent,
        "frames_lost": tally.frames_lost,
        "failed_clean_conversations": dict(tally.failures),
        "resumes": {
            "resumed_by_clients": tally.resumed,
            "server": {k: v - before["resumes"].get(k, 0.0) for k, v in after["resumes"].items()},
        },
        "steady": steady.report() if args.steady else None,
        "rss_mb": {
            "idle_start": before["rss_mb"],
            "after_warmup": rss_warm,
            "peak": rss_peak,
            "steady": round(float(np.median(second_half)), 1),
            "idle_end": after["rss_mb"],
        },
        "rss_growth_after_warmup_pct": round(100 * (after["rss_mb"] - rss_warm) / rss_warm, 2),
        "fds": {"idle_start": before["fds"], "idle_end": after["fds"], "peak": max(s["fds"] for s in samples)},
        "threads": {"idle_start": before["threads"], "idle_end": after["threads"]},
        "trio_tasks": {"idle_start": before["tasks"], "idle_end": after["tasks"]},
        "slots_free_end": after["slots_free"],
        "sessions_end": after["sessions"],
        "queued_end": after["queued"],
        "drops": {k: v - before["drops"].get(k, 0.0) for k, v in after["drops"].items() if v != before["drops"].get(k)},
    }


def plot(samples: list[dict], path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in samples]
    fig, rss = plt.subplots(figsize=(9, 4))
    rss.plot(t, [s["rss_mb"] for s in samples], color="tab:blue", label="RSS (server + encoder), MB")
    rss.set_xlabel("minutes")
    rss.set_ylabel("RSS, MB", color="tab:blue")
    rss.set_ylim(bottom=0)
    fds = rss.twinx()
    fds.plot(t, [s["fds"] for s in samples], color="tab:orange", label="open fds")
    fds.plot(t, [s["sessions"] for s in samples], color="tab:green", alpha=0.5, label="sessions")
    fds.set_ylabel("open fds / sessions")
    fds.set_ylim(bottom=0)
    fig.legend(loc="upper right")
    rss.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32, help="conversations at a time (default 32)")
    parser.add_argument("--slots", type=int, help="server slots (default: three quarters of the clients)")
    parser.add_argument("--duration", type=float, default=120, help="seconds of churn (default 120)")
    parser.add_argument("--warmup", type=float, default=60, help="seconds before RSS growth is counted (default 60)")
    parser.add_argument("--every", type=float, default=5, help="seconds between samples (default 5)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--steady",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="beside the churn, one raw conversation streaming for the whole run (default on)",
    )
    parser.add_argument(
        "--steady-db",
        type=float,
        default=-50.0,
        help="its noise level, dBFS RMS (default -50: a quiet line, below the speech threshold)",
    )
    parser.add_argument("--name", default="soak", help="results: NAME.json and NAME.png under --results")
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS, help="their folder (default bench/results)")
    args = parser.parse_args()
    args.slots = args.slots or max(1, args.clients * 3 // 4)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = ServerProcess(
        [
            "-m",
            "pplex_trio",
            "serve",
            "--model",
            "echo:step_ms=5,prompt=12",
            "--slots",
            str(args.slots),
            "--port",
            "0",
            "--queue-size",
            str(args.clients),
            "--client-timeout",
            str(CLIENT_TIMEOUT),
            "--resume-seconds",
            str(RESUME_SECONDS),
        ]
    )
    port = int(server.address.rsplit(":", 1)[1])
    steady = Steady()
    try:
        samples, tally, before, after = trio.run(run, args, server, port, steady)
    finally:
        code = server.stop()
    summary = summarize(args, samples, tally, before, after, steady)
    summary["server_exit_code"] = code
    summary["server_log"] = dict(
        collections.Counter(
            line.split()[2] for line in server.log if len(line.split()) > 2 and line.split()[2] in ("WARNING", "ERROR")
        )
    )
    summary["server_errors"] = [line.strip()[:200] for line in server.log if " ERROR " in line][:10]
    summary["session_outcomes"] = dict(
        collections.Counter(line.rsplit("ended: ", 1)[1].split()[0] for line in server.log if " ended: " in line)
    )  # (less quality)
    summary["connections_aborted"] = sum(" aborted" in line for line in server.log)
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / args.name
    stem.with_suffix(".json").write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    plot(samples, stem.with_suffix(".png"), f"bench/soak: {args.clients} churning clients, {args.slots} slots")
    print(json.dumps(summary, indent=1))
    print(f"wrote {stem}.json and {stem}.png")
    if args.steady and not summary["steady"]["exact"]:
        logger.error("the steady conversation lost frames: %s", summary["steady"])
        return 1
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    raise SystemExit(main())
