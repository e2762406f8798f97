#!/usr/bin/env python3
"""bench/load: N concurrent clients against a pplex-trio server, over /api/chat, /v1/realtime, /v1/live/sessions or
/telephony/twilio.

Each client streams real speech (``../shared/data/*.wav``) at real-time pace:
with ``--protocol moshi`` as Ogg Opus pages, one page (two 20 ms packets) per
message like the browser; with ``--protocol realtime`` as OpenAI Realtime
``input_audio_buffer.append`` events of base64 PCM16, one per page's worth of
audio; with ``--protocol live`` the same as OpenAI Live
``session.input_audio.append`` events (after ``session.start``); with
``--protocol twilio`` as a Twilio call's ``media`` events (μ-law at 8 kHz,
20 ms each, as Twilio sends them, whatever ``--page-ms``).  Each is
pre-encoded once and replayed so the generator stays cheap (the clients are in
``_load_clients.py``).  It receives everything, decodes a sample of the
clients' audio (Moshi), and counts frames (an audio delta is a frame).

Usage (from the repository root)::

    python bench/load.py --clients 64 --duration 30            # starts `serve --model echo --slots 64`
    python bench/load.py --clients 64 --compare-framing        # naive vs aligned framing, one run
    python bench/load.py --find-max --duration 30              # largest N that holds real time
    python bench/load.py --url http://127.0.0.1:8998 --clients 8   # a server you started
    python bench/load.py --clients 32 --compare-protocols      # /api/chat, /v1/realtime, /v1/live/sessions, twilio
    python bench/load.py --clients 32 --compare-protocols realtime,twilio   # those two, one run
    python bench/load.py --clients 16 --duration 20 --compare-status   # without, then with the status page open
    python bench/load.py --model tiny --clients 2 --duration 20 --compare-transcribe   # --transcribe off, then tiny

``--traffic official`` behaves like the official web client: 20 ms Opus
packets two per Ogg page (a message every 40 ms), streaming from the handshake,
with ``--random-phase-share`` (0.25) of the clients starting at a random phase
as a telephony bridge would, and an echo engine that emits text on 30 % of
frames (``--text-share``), about what a speaking model produces.  The
default ``mixed`` traffic is the one of the earlier figures: every client at a
random phase (``--start-phase``), text on every frame.

``--compare-status`` runs twice, the second time with a client polling
``/api/status`` once a second as the status page does (``status polls``
counts its answers): what the page costs the tick.

``--compare-transcribe`` (on ``--model tiny`` or a real model: the echo
engine has no transcriber) runs the same load twice, one server each: with
``--transcribe off``, then ``--transcribe tiny`` (or the transcriber named,
``--compare-transcribe kyutai/stt-1b-en_fr``): the speech-to-text model
stepped in the same tick, its ``cpu ratio`` over the run without it, and
each run's ticks skipped.  ``--transcribe`` passes one choice to a single
run's server.

``cpu %`` is the server process; ``+child %`` adds its child processes (the
Opus encoder child), and ``cpu ms/conv-s`` divides that whole by the
conversations: the server's CPU per second of one conversation.

``gen late`` counts pages the generator itself sent over 5 ms behind
schedule: a run with many is measuring the generator's stalls too.

Real time held = no frame lost (dropped by a full queue anywhere in the
server) and p99 tick lateness <= 10 ms over the window.  Late input frames
(a tick that came before its frame: the frame is heard one tick later) and
the aligned framer's catch-up skips are counted in their own columns.
``cpu ratio`` (with ``--compare-protocols``) is a run's CPU per
conversation-second over the Moshi run's, for Live also over Realtime's, and
for Twilio over Realtime's.
Prints a table, writes JSON and PNG plots under bench/results/ (``--results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import logging
import math
import pathlib
import random
import sys
import time
from typing import Any

import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from _load_clients import PATHS, PROTOCOLS, SR, ClientStats, encode_pages, encode_stream, run_client, speech  # noqa: E402, F401 (ClientStats, encode_pages, run_client, speech: ready.py, voices.py)
from _metrics import Histogram, fetch_text, parse  # noqa: E402
from _serverproc import ServerProcess  # noqa: E402

logger = logging.getLogger("bench.load")
RESULTS = REPO / "bench" / "results"


# --- the load ----------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
    label: str
    clients: int
    duration: float
    window_s: float
    sessions_ok: int
    sent_frames: float
    received_frames: int
    dropped: float
    late: float
    skipped_ms: float
    tick_p50_ms: float
    tick_p99_ms: float
    lateness_p50_ms: float
    lateness_p99_ms: float
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    ticks_skipped: float
    cpu_percent: float
    peak_rss_mb: float
    decode_errors: int
    generator_late_sends: int  # pages the load generator itself sent late (its stalls, not the server's)
    status_polls: int = 0  # /api/status answers during the window (--compare-status)
    per_session: list[dict] = dataclasses.field(default_factory=list)
    latency_cdf: tuple[list[float], list[float]] = ((), ())
    stages_p50_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    ticks_held: float = 0.0  # ticks held up to the input grace for a page that was due
    tree_cpu_percent: float = math.nan  # the server with its child processes (the Opus encoder child)
    cpu_ratios: dict[str, float] = dataclasses.field(default_factory=dict)  # protocol → this CPU / that run's

    @property
    def cpu_ms_per_conversation_second(self) -> float:
        """The whole server's CPU (encoder child included) per second of one conversation."""
        return self.tree_cpu_percent * 10 / self.clients  # (cpu % / 100) × 1000 ms, over the conversations

    @property
    def lost(self) -> float:
        """Frames thrown away because the server could not keep up (a full queue).

        Not counted: *late* input frames (the tick came before the frame,
        which is then heard one tick later, not lost) and the few ms the
        aligned framer skips once to catch up with the newest audio; both are
        reported in their own columns.
        """
        return self.dropped

    @property
    def real_time(self) -> bool:
        return self.sessions_ok == self.clients and self.lost == 0 and self.lateness_p99_ms <= 10.0


def spread(index: int, share: float) -> bool:
    """Whether client ``index`` is one of an evenly spread ``share`` of them."""
    return int((index + 1) * share) > int(index * share)


async def load_run(
    http_url: str,
    clients: int,
    duration: float,
    page_ms: int,
    pages: list[Any],
    *,
    label: str,
    server: ServerProcess | None,
    warmup: float,
    decode_every: int,
    random_phase_share: float = 1.0,
    protocol: str = "moshi",
    query: str = "",
    poll_status: bool = False,
) -> RunResult:
    """``query`` (Moshi only, such as ``text_prompt=...&voice_prompt=NATF2.pt``) starts each conversation
    with that system prompt; without it the server's defaults apply.  ``poll_status``: a client reads
    ``/api/status`` once a second all along, as an open status page does."""
    ws_url = http_url.replace("http://", "ws://") + PATHS[protocol]
    if query and protocol == "moshi":
        ws_url += "?" + query
    stats = [ClientStats(i) for i in range(clients)]
    live, stop = trio.Semaphore(0), trio.Event()
    started_at = trio.current_time()
    async with trio.open_nursery() as nursery:
        for s in stats:
            nursery.start_soon(
                functools.partial(
                    run_client,
                    ws_url,
                    pages,
                    page_ms,
                    s,
                    decode=s.index % decode_every == 0,
                    live=live,
                    stop=stop,
                    started_at=started_at,
                    random_phase=spread(s.index, random_phase_share),
                )
            )
        polls = [0]
        if poll_status:
            nursery.start_soon(_poll_status, http_url, stop, polls)
        with trio.fail_after(120):
            for _ in range(clients):
                await live.acquire()
        await trio.sleep(warmup)  # past the first alignment of every session
        before_text = await fetch_text(http_url)  # parsed after the run, off the clock
        cpu0, t0 = (server.cpu_seconds() if server else math.nan), time.monotonic()
        tree0 = server.tree_cpu_seconds() if server else math.nan
        polls0 = polls[0]
        sent0 = [s.sent_frames for s in stats]
        late0 = [s.late_sends for s in stats]
        recv0 = [s.audio_received for s in stats]
        await trio.sleep(duration)
        after_text = await fetch_text(http_url)
        cpu1, t1 = (server.cpu_seconds() if server else math.nan), time.monotonic()
        tree1 = server.tree_cpu_seconds() if server else math.nan
        status_polls = polls[0] - polls0
        for s, a, b, c in zip(stats, sent0, recv0, late0):
            s.window_sent, s.window_received = s.sent_frames - a, s.audio_received - b
            s.window_late_sends = s.late_sends - c
        stop.set()
    before, after = parse(before_text), parse(after_text)
    window = t1 - t0
    tick = Histogram.between(before, after, "pplex_tick_duration_seconds")
    lateness = Histogram.between(before, after, "pplex_tick_lateness_seconds")
    latency = Histogram.between(before, after, "pplex_added_latency_seconds")
    delta = lambda name: after.total(name) - before.total(name)  # noqa: E731
    ok = [s for s in stats if not s.error and not math.isnan(s.handshake_s)]
    return RunResult(
        label=label,
        clients=clients,
        duration=duration,
        window_s=window,
        sessions_ok=len(ok),
        sent_frames=sum(s.window_sent for s in stats),
        received_frames=sum(s.window_received for s in stats),
        dropped=delta("pplex_frames_dropped_total"),
        late=delta("pplex_frames_silence_filled_total"),
        skipped_ms=delta("pplex_input_samples_skipped_total") / SR * 1000,
        tick_p50_ms=1000 * tick.quantile(0.5),
        tick_p99_ms=1000 * tick.quantile(0.99),
        lateness_p50_ms=1000 * lateness.quantile(0.5),
        lateness_p99_ms=1000 * lateness.quantile(0.99),
        latency_p50_ms=1000 * latency.quantile(0.5),
        latency_p90_ms=1000 * latency.quantile(0.9),
        latency_p99_ms=1000 * latency.quantile(0.99),
        ticks_skipped=delta("pplex_ticks_skipped_total"),
        cpu_percent=100 * (cpu1 - cpu0) / window if server else math.nan,
        tree_cpu_percent=100 * (tree1 - tree0) / window if server else math.nan,
        peak_rss_mb=server.peak_rss_mb() if server else math.nan,
        decode_errors=sum(s.decode_errors for s in stats),
        generator_late_sends=sum(s.window_late_sends for s in stats),
        status_polls=status_polls,
        per_session=[dataclasses.asdict(s) for s in stats],
        latency_cdf=latency.cdf(),
        stages_p50_ms={
            stage: 1000
            * Histogram.between(before, after, "pplex_added_latency_stage_seconds", stage=stage).quantile(0.5)
            for stage in ("wait_for_tick", "tick", "encode", "send")
        },
        ticks_held=Histogram.between(before, after, "pplex_tick_input_wait_seconds").count,
    )


async def _poll_status(http_url: str, stop: trio.Event, polls: list[int]) -> None:
    """What an open status page does: ``GET /api/status`` once a second (``polls[0]`` counts the answers)."""
    due = trio.current_time()
    while not stop.is_set():
        json.loads(await fetch_text(http_url, "/api/status"))
        polls[0] += 1
        due += 1.0
        with trio.move_on_at(due):
            await stop.wait()


# --- driving it ----------------------------------------------------------------------


def start_server(args: argparse.Namespace, slots: int, framing: str, transcribe: str | None = None) -> ServerProcess:
    """``transcribe``: the server's ``--transcribe`` (else ``--transcribe`` as given, else the server's default)."""
    model = args.model
    if model == "echo":
        model = f"echo:step_ms={args.step_ms:g},prompt=12,text_share={text_share(args):g}"
    flags = ["--model", model, "--slots", str(slots), "--port", "0", "--queue-size", "0", "--framing", framing]
    if args.opus_encoder.startswith("thread-"):  # the comparison variant: a bench-only server entry
        cmd = [str(BENCH / "thread_encoder_server.py"), args.opus_encoder.removeprefix("thread-"), *flags]
    else:
        cmd = ["-m", "pplex_trio", "serve", *flags, "--opus-encoder", args.opus_encoder]
    if args.inline_encoders is not None:
        cmd += ["--inline-encoders", str(args.inline_encoders)]
    transcribe = transcribe or args.transcribe
    if transcribe is not None:
        cmd += ["--transcribe", transcribe]
    return ServerProcess(cmd)


def random_phase_share(args: argparse.Namespace) -> float:
    """The share of clients that start at a random phase (the rest stream from the handshake)."""
    if args.traffic == "official":
        return args.random_phase_share
    return 1.0 if args.start_phase == "random" else 0.0


def text_share(args: argparse.Namespace) -> float:
    if args.text_share is not None:
        return args.text_share
    return 0.3 if args.traffic == "official" else 1.0


def one(
    args: argparse.Namespace,
    clients: int,
    framing: str,
    pages: list[Any],
    protocol: str | None = None,
    poll_status: bool = False,
    transcribe: str | None = None,
) -> RunResult:
    protocol = protocol or args.protocol
    share = random_phase_share(args)
    start = {1.0: "random", 0.0: "handshake"}.get(share, f"{share:g} random")
    label = f"{protocol}, {args.traffic} traffic, {framing}, {start} start, N={clients}"
    if poll_status:
        label += ", /api/status polled 1/s"
    if transcribe or args.transcribe:
        label += f", --transcribe {transcribe or args.transcribe}"
    options = dict(
        warmup=args.warmup,
        decode_every=args.decode_every,
        random_phase_share=share,
        protocol=protocol,
        label=label,
        poll_status=poll_status,
    )
    if args.url:
        return trio.run(lambda: load_run(args.url, clients, args.duration, args.page_ms, pages, server=None, **options))
    server = start_server(args, clients, framing, transcribe)
    try:
        url = "http://" + server.address
        return trio.run(lambda: load_run(url, clients, args.duration, args.page_ms, pages, server=server, **options))
    finally:
        server.stop()


COLUMNS = [
    ("run", lambda r: r.label, "{}"),
    ("ok", lambda r: f"{r.sessions_ok}/{r.clients}", "{}"),
    ("sent", lambda r: r.sent_frames, "{:.0f}"),
    ("recv", lambda r: r.received_frames, "{:.0f}"),
    ("dropped", lambda r: r.dropped, "{:.0f}"),
    ("late", lambda r: r.late, "{:.0f}"),
    ("skip ms", lambda r: r.skipped_ms, "{:.0f}"),
    ("held", lambda r: r.ticks_held, "{:.0f}"),
    ("tick p50/p99 ms", lambda r: f"{r.tick_p50_ms:.1f}/{r.tick_p99_ms:.1f}", "{}"),
    ("late p50/p99 ms", lambda r: f"{r.lateness_p50_ms:.2f}/{r.lateness_p99_ms:.2f}", "{}"),
    ("added p50/p90/p99 ms", lambda r: f"{r.latency_p50_ms:.1f}/{r.latency_p90_ms:.1f}/{r.latency_p99_ms:.1f}", "{}"),
    (
        "stages p50 ms (wait/tick/enc/send)",
        lambda r: "/".join(
            f"{r.stages_p50_ms.get(k, math.nan):.1f}" for k in ("wait_for_tick", "tick", "encode", "send")
        ),
        "{}",
    ),
    ("gen late", lambda r: r.generator_late_sends, "{}"),
    ("status polls", lambda r: r.status_polls, "{}"),
    ("cpu %", lambda r: r.cpu_percent, "{:.0f}"),
    ("+child %", lambda r: r.tree_cpu_percent, "{:.0f}"),
    ("cpu ms/conv-s", lambda r: r.cpu_ms_per_conversation_second, "{:.1f}"),
    ("cpu ratio", lambda r: ", ".join(f"{v:.2f}x {k}" for k, v in r.cpu_ratios.items()) or "-", "{}"),
    ("rss MB", lambda r: r.peak_rss_mb, "{:.0f}"),
    ("real time", lambda r: "yes" if r.real_time else "NO", "{}"),
]


def table(results: list[RunResult]) -> str:
    rows = [[c[0] for c in COLUMNS]] + [[c[2].format(c[1](r)) for c in COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def plot(results: list[RunResult], path: pathlib.Path, title: str, by_clients: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        xs, ys = r.latency_cdf
        axes[0].step([1000 * x for x in xs], ys, where="post", label=r.label)
    axes[0].set(
        xlabel="server-added latency per frame (ms)",
        ylabel="fraction of frames",
        title="Added latency CDF",
        xlim=(0, 100),
    )
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if by_clients:
        ordered = sorted(results, key=lambda r: r.clients)
        axes[1].plot(
            [r.clients for r in ordered], [r.lateness_p99_ms for r in ordered], "o-", label="tick lateness p99"
        )
        axes[1].plot([r.clients for r in ordered], [r.latency_p50_ms for r in ordered], "s-", label="added latency p50")
        axes[1].axhline(10, color="grey", ls="--", lw=1)
        axes[1].set(xlabel="concurrent conversations", ylabel="ms", title="Lateness and latency vs N")
    else:
        names = [r.label for r in results]
        axes[1].bar(names, [r.latency_p50_ms for r in results], label="added latency p50")
        axes[1].bar(names, [r.lateness_p99_ms for r in results], alpha=0.6, label="tick lateness p99")
        axes[1].set(ylabel="ms", title="Per run")
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent conversations (default 16)")
    parser.add_argument("--duration", type=float, default=30.0, help="measured window in seconds (default 30)")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds after all are live, before measuring")
    parser.add_argument("--url", help="an already running server (http://host:port); else one is started")
    parser.add_argument(
        "--model",
        default="echo",
        help="model for the started server: echo or tiny (default echo: "
        "the echo engine with --step-ms and --text-share, and a 12-position prompt), or "
        "echo:OPTIONS as given",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=20.0,
        help="with --model echo: the echo engine's compute stand-in per tick (default 20)",
    )
    parser.add_argument("--framing", choices=("aligned", "naive"), default="aligned")
    parser.add_argument(
        "--opus-encoder",
        default="auto",
        help="the started server's --opus-encoder (auto, process, inline, sphn), or thread-libopus / "
        "thread-sphn: the worker-thread placement kept in bench/ for comparison",
    )
    parser.add_argument("--inline-encoders", type=int, help="the started server's --inline-encoders")
    parser.add_argument("--compare-framing", action="store_true", help="run naive then aligned, side by side")
    parser.add_argument(
        "--compare-status",
        action="store_true",
        help="run without, then with a client polling /api/status once a second, side by side",
    )
    parser.add_argument(
        "--traffic",
        choices=("mixed", "official"),
        default="mixed",
        help="mixed: every client per --start-phase, a text piece every frame; official: like the "
        "official web client (two 20 ms packets per page, streaming from the handshake) with "
        "--random-phase-share of them at a random phase, and --text-share 0.3 (default mixed)",
    )
    parser.add_argument(
        "--random-phase-share",
        type=float,
        default=0.25,
        help="with --traffic official: the share of clients starting at a random phase, like a "
        "telephony bridge (default 0.25)",
    )
    parser.add_argument(
        "--text-share",
        type=float,
        help="with --model echo: the echo engine's share of frames with text (default 0.3 with "
        "--traffic official, else 1)",
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="moshi",
        help="/api/chat (Ogg Opus), /v1/realtime or /v1/live/sessions (base64 PCM16 JSON events), "
        "twilio (a Twilio call: μ-law 8 kHz media events every 20 ms); default moshi",
    )
    parser.add_argument(
        "--compare-protocols",
        nargs="?",
        const=",".join(PROTOCOLS),
        type=protocol_list,
        metavar="P,Q,...",
        help=f"run these protocols (default all: {','.join(PROTOCOLS)}), one server each, side by "
        "side, each one's CPU relative to the others' (realtime and live to moshi, live and twilio "
        "to realtime)",
    )
    parser.add_argument(
        "--transcribe",
        help="the started server's --transcribe (off, tiny, auto, a Kyutai speech-to-text repo id or folder)",
    )
    parser.add_argument(
        "--compare-transcribe",
        nargs="?",
        const="tiny",
        metavar="STT",
        help="run the same load twice, one server each: --transcribe off, then --transcribe STT (default tiny), "
        "side by side, the second's CPU per conversation-second over the first's (needs a --model other than echo)",
    )
    parser.add_argument("--find-max", action="store_true", help="search the largest N that holds real time")
    parser.add_argument("--max-clients", type=int, default=160, help="upper bound for --find-max")
    parser.add_argument(
        "--start-phase",
        choices=("random", "handshake"),
        default="random",
        help="random: each client starts streaming at a random moment after the handshake; "
        "handshake: at once, as the official client does",
    )
    parser.add_argument(
        "--page-ms",
        type=int,
        choices=(20, 40, 80),
        default=40,
        help="audio per message: 40 = one Ogg page of two 20 ms packets, like the browser",
    )
    parser.add_argument("--decode-every", type=int, default=8, help="decode the audio of every k-th client")
    parser.add_argument("--name", default="load", help="file name stem under --results")
    parser.add_argument(
        "--results",
        type=pathlib.Path,
        default=RESULTS,
        help="folder of the NAME.json and NAME.png (default bench/results)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    random.seed(args.seed)
    if args.page_ms == 20:
        parser.error("--page-ms 20 needs 20 ms pages, which sphn's writer does not produce")
    if (args.compare_transcribe or args.transcribe not in (None, "off")) and args.model.startswith("echo"):
        parser.error("a transcriber needs a model that hears (--model tiny or a real one): the echo engine has none")
    if args.compare_transcribe == "off":
        parser.error("--compare-transcribe off: name the transcriber to set against off (tiny, a repo id)")
    args.results.mkdir(parents=True, exist_ok=True)
    seconds = args.duration + args.warmup + 30
    streams = {
        protocol: encode_stream(protocol, seconds, args.page_ms)
        for protocol in (args.compare_protocols or (args.protocol,))
    }
    pages = streams.get(args.protocol, [])
    gc.freeze()  # the generator's own collections would delay every client's pages at once

    results: list[RunResult] = []
    runs: dict[str, RunResult] = {}  # with --compare-protocols, by protocol
    transcribed: dict[str, RunResult] = {}  # with --compare-transcribe: "off", then the transcriber
    if args.find_max:
        results = find_max(args, pages)
    elif args.compare_status:
        for poll_status in (False, True):
            results.append(one(args, args.clients, args.framing, pages, poll_status=poll_status))
            print(table(results[-1:]), flush=True)
    elif args.compare_framing:
        for framing in ("naive", "aligned"):
            results.append(one(args, args.clients, framing, pages))
            print(table(results[-1:]), flush=True)
    elif args.compare_transcribe:
        for transcribe in ("off", args.compare_transcribe):
            transcribed[transcribe] = one(args, args.clients, args.framing, pages, transcribe=transcribe)
            transcribed[transcribe].cpu_ratios = transcribe_ratio(transcribed, transcribe)
            results.append(transcribed[transcribe])
            print(table(results[-1:]), flush=True)
    elif args.compare_protocols:
        for protocol in args.compare_protocols:
            runs[protocol] = one(args, args.clients, args.framing, streams[protocol], protocol)
            runs[protocol].cpu_ratios = cpu_ratios(runs, protocol)
            results.append(runs[protocol])
            print(table(results[-1:]), flush=True)
    else:
        results.append(one(args, args.clients, args.framing, pages))
    print()
    print(table(results))
    stem = args.results / args.name
    stem.with_suffix(".json").write_text(
        json.dumps(
            {
                "command": " ".join(["python", "bench/load.py", *(argv if argv is not None else sys.argv[1:])]),
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "results": [
                    {k: v for k, v in dataclasses.asdict(r).items() if k not in ("per_session", "latency_cdf")}
                    | {"lost": r.lost, "real_time": r.real_time}
                    for r in results
                ],
                "per_session": {r.label: r.per_session for r in results},
            },
            indent=1,
        )
    )
    plot(
        results,
        stem.with_suffix(".png"),
        f"bench/load: {args.model} engine, {args.page_ms} ms pages",
        by_clients=args.find_max,
    )
    print(f"\nwrote {stem.with_suffix('.json')} and {stem.with_suffix('.png')}")
    if args.find_max:
        best = max((r.clients for r in results if r.real_time), default=0)
        print(f"largest N holding real time: {best}")
    if runs:
        print(protocols_summary(runs))
    if transcribed:
        print(transcribe_summary(transcribed))
    return 0


# Whose CPU each protocol's is set against.
RATIO_BASES = {"realtime": ("moshi",), "live": ("moshi", "realtime"), "twilio": ("realtime",)}
RATIO_TARGETS = {("realtime", "moshi"): 1.2, ("live", "realtime"): 1.1}  # issue 13's, and the Live endpoint's


def protocol_list(text: str) -> tuple[str, ...]:
    """``--compare-protocols realtime,twilio``: known protocols, in the order given."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in PROTOCOLS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give protocols among {', '.join(PROTOCOLS)}")
    return names


def cpu_ratios(runs: dict[str, RunResult], protocol: str) -> dict[str, float]:
    """``protocol``'s CPU per conversation-second over that of each of its bases already in ``runs``."""
    mine = runs[protocol].cpu_ms_per_conversation_second
    return {
        base: mine / runs[base].cpu_ms_per_conversation_second for base in RATIO_BASES.get(protocol, ()) if base in runs
    }


def protocols_summary(runs: dict[str, RunResult]) -> str:
    """One line per protocol: its CPU per conversation-second, and its ratios against their targets."""
    lines = ["server CPU per conversation-second:"]
    for protocol, run in runs.items():
        ratios = [
            f"{ratio:.2f}x {base}"
            + (
                f" (target <= {RATIO_TARGETS[protocol, base]:g}: "
                f"{'met' if ratio <= RATIO_TARGETS[protocol, base] else 'NOT met'})"
                if (protocol, base) in RATIO_TARGETS
                else ""
            )
            for base, ratio in run.cpu_ratios.items()
        ]
        lines.append(
            f"  {protocol:8} {run.cpu_ms_per_conversation_second:5.1f} ms"
            + (f"  ratio {', '.join(ratios)}" if ratios else "")
            + ("" if run.real_time else "  (NOT real time)")
        )
    return "\n".join(lines)


def transcribe_ratio(runs: dict[str, RunResult], transcribe: str) -> dict[str, float]:
    """A run with a transcriber: its CPU per conversation-second over the run without (``"off"``), once that ran."""
    if transcribe == "off" or "off" not in runs:
        return {}
    return {"off": runs[transcribe].cpu_ms_per_conversation_second / runs["off"].cpu_ms_per_conversation_second}


def transcribe_summary(runs: dict[str, RunResult]) -> str:
    """One line per run of ``--compare-transcribe``: CPU per conversation-second, the ratio, real time, ticks skipped,
    tick p50/p99."""
    lines = ["server CPU per conversation-second, without and with the transcriber:"]
    for transcribe, run in runs.items():
        ratio = run.cpu_ratios.get("off")
        lines.append(
            f"  --transcribe {transcribe:6} {run.cpu_ms_per_conversation_second:6.1f} ms"
            + (f"  {ratio:.2f}x off" if ratio is not None else "")
            + f"  tick p50/p99 {run.tick_p50_ms:.1f}/{run.tick_p99_ms:.1f} ms"
            + f"  ticks skipped {run.ticks_skipped:.0f}  dropped {run.dropped:.0f}"
            + f"  real time {'yes' if run.real_time else 'NO'}"
        )
    return "\n".join(lines)


def find_max(args: argparse.Namespace, pages: list[bytes]) -> list[RunResult]:
    """Double N until real time breaks, then bisect between the last good and first bad N."""
    results: dict[int, RunResult] = {}

    def holds(n: int) -> bool:
        if n not in results:
            results[n] = one(args, n, args.framing, pages)
            print(table([results[n]]), flush=True)
        return results[n].real_time

    good, bad = 0, None
    n = 16
    while n <= args.max_clients:
        if holds(n):
            good, n = n, n * 2
        else:
            bad = n
            break
    if bad is None:
        bad = args.max_clients + 1
        if good < args.max_clients and holds(args.max_clients):
            good = args.max_clients
    while bad - good > max(4, good // 16):
        mid = (good + bad) // 2
        if holds(mid):
            good = mid
        else:
            bad = mid
    return [results[k] for k in sorted(results)]


if __name__ == "__main__":
    sys.exit(main())
