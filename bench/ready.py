#!/usr/bin/env python3
"""bench/ready: how long a caller waits before the model hears them, ours beside NVIDIA's PersonaPlex server.

What a user meets first is the system prompt (the voice, 0.5 s of silence,
the persona, 0.5 s of silence), which the model must run before it can
listen.  Three measurements:

* **personas** (always): connect -> handshake (``0x00``) and connect -> first
  audio message, on ``/api/chat``, for personas of 40, 100, 400 and 1000
  characters with the checkpoint's voice, ``--repeats`` conversations each,
  one at a time.  Ours serves the checkpoint with ``pplex-trio serve``; with
  ``--personaplex DIR`` (a checkout of github.com/NVIDIA/personaplex, never
  copied here) NVIDIA's own server serves the same checkpoint
  (``bench/_personaplex_launch.py``, in a venv of its own pins made on
  first use, ``bench/.venv-personaplex``), the two taking turns.
* **joins under load** (``--load``, ours only: NVIDIA's server serves one
  conversation at a time): ``--live`` conversations talk (real speech, official
  traffic), and ``--rounds`` times ``--joiners`` more join at once (each waits
  for its handshake and leaves); the joiners' connect -> handshake p50/p99,
  and the live ones' tick lateness p99 over the joining intervals (while the
  prompts run) and over as many ticks alone just after each, from the
  server's own histograms.
  The echo engine with ``--step-ms`` stands in for the GPU (a prompt
  of ``--prompt-positions`` positions, each costing a fiftieth of a tick
  there).  The same joins are run again with prompts of no positions (the
  control): what the joiners' own traffic costs the live ones, beside what
  their prompts cost.
* **first words** (``--first-words``): a Realtime client made with the
  official OpenAI SDK (as ``examples/openai_sdk.py``) that talks at once, as
  LiveKit's and Pipecat's do: ``session.update``, then 3 s of real speech from
  its first append, without waiting for ``response.created``; against the
  echo engine, how much of those 3 s comes back (each 80 ms frame of speech
  whose best match in the answer correlates above 0.995).
  ``--server-checkout DIR`` runs the server from another checkout (an older
  commit, for a before/after figure).
* the checkpoint defaults to ``../shared/golden/tiny-public`` (PersonaPlex
  layout, its voice ``TINY0.pt``); ``--checkpoint DIR`` for another.

Usage (from the repository root)::

    git clone /path/to/personaplex /tmp/personaplex      # or: git clone https://github.com/NVIDIA/personaplex
    python bench/ready.py --personaplex /tmp/personaplex  # personas, both servers
    python bench/ready.py --load                          # joins under load, ours
    python bench/ready.py --first-words [--server-checkout /tmp/before]

Prints a table with both servers and the ours/theirs ratio, and writes
``bench/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import _reference_client as client  # noqa: E402
import _reference_env as refenv  # noqa: E402
import load  # noqa: E402
from _metrics import Histogram, fetch_text, parse  # noqa: E402
from _serverproc import ServerProcess  # noqa: E402
from reference import free_port  # noqa: E402

logger = logging.getLogger("bench.ready")
GOLDEN = REPO.parent / "shared" / "golden" / "tiny-public"
RESULTS = REPO / "bench" / "results"
LAUNCHER = REPO / "bench" / "_personaplex_launch.py"
PERSONA_LENGTHS = (40, 100, 400, 1000)
MATCH = 0.995  # the echo returns a frame whole (16-bit rounding aside); other speech rarely matches this well
TEXT = (
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way. "
    "You enjoy having a good conversation. Have a deep conversation about technology. Your name is Jane. "
    "You work for a small bakery in the old town. Take orders, answer questions about bread and cakes. "
)


def persona(chars: int) -> str:
    """The first ``chars`` characters of a long persona, cut at a word."""
    text = (TEXT * (chars // len(TEXT) + 1))[: chars + 1]
    return text[: text.rfind(" ")] if len(text) > chars else text


def start_ours(checkpoint: pathlib.Path, *flags: str, source: pathlib.Path = REPO) -> ServerProcess:
    return ServerProcess(
        ["-m", "pplex_trio", "serve", "--model", str(checkpoint), "--device", "cpu", "--port", "0", *flags],
        startup_timeout=300,
        env={"PYTHONPATH": str(source)},
        cwd=str(source),
    )


def start_personaplex(checkout: pathlib.Path, checkpoint: pathlib.Path, venv: pathlib.Path) -> ServerProcess:
    return ServerProcess(
        [str(LAUNCHER), "--checkpoint", str(checkpoint), "--port", str(free_port())],
        python=str(refenv.python(venv)),
        startup_timeout=300,
        env={"PYTHONPATH": str(checkout / "moshi")},
    )


PERSONAPLEX_VENV = REPO / "bench" / ".venv-personaplex"


def ensure_personaplex_venv(checkout: pathlib.Path, venv: pathlib.Path = PERSONAPLEX_VENV) -> str:
    """A venv for NVIDIA's fork (made once): its own pins from the checkout's ``moshi/pyproject.toml`` (sphn 0.1,
    numpy < 2.2 ...), torch held at ours as for Kyutai's reference (``bench/_reference_env.py``), and tqdm,
    which its ``lm.py`` imports.  Returns its versions."""
    import tomllib

    python = str(refenv.python(venv))
    probe = [
        python,
        "-c",
        "import importlib.metadata as m, aiohttp, sphn, torch, tqdm, einops; "
        "print(torch.__version__, m.version('sphn'), m.version('numpy'), m.version('aiohttp'))",
    ]
    found = subprocess.run(probe, capture_output=True, text=True) if pathlib.Path(python).exists() else None
    if found is None or found.returncode:
        requires = tomllib.loads((checkout / "moshi" / "pyproject.toml").read_text())["project"]["dependencies"]
        keep, left = refenv.runtime_requirements(requires)
        logger.info("creating %s for NVIDIA's fork: %s (left out: %s)", venv, keep, left)
        refenv._check(refenv._run([sys.executable, "-m", "venv", "--clear", str(venv)]))
        pip = [python, "-m", "pip", "install", "--quiet"]
        refenv._check(refenv._run([*pip, refenv.TORCH]))
        refenv._check(refenv._run([*pip, *keep, "tqdm", refenv.TORCH]))
        found = subprocess.run(probe, capture_output=True, text=True, check=True)
    return found.stdout.strip()


async def one_conversation(url: str, text: str, voice: str, pages: list[bytes]) -> client.Trace:
    t0 = trio.current_time()
    trace = client.Trace(0)
    query = {
        "text_prompt": text,
        "voice_prompt": voice,
        "text_temperature": 0.7,
        "text_topk": 25,
        "audio_temperature": 0.8,
        "audio_topk": 250,
    }
    await client.converse(
        client.chat_url(url, **query),
        pages,
        trace,
        clock=lambda: trio.current_time() - t0,
        stream_pages=25,
        wait_timeout=300,
        drain=0.3,
    )
    return trace


def personas(servers: dict[str, str], voice: str, repeats: int, pages: list[bytes]) -> dict[str, dict]:
    """connect -> handshake / first audio per persona length, the servers taking turns."""
    out: dict[str, dict] = {side: {} for side in servers}
    for chars in PERSONA_LENGTHS:
        text = persona(chars)
        for side in servers:
            out[side][chars] = {"handshake_s": [], "first_audio_s": [], "errors": []}
        for _ in range(repeats):
            for side, url in servers.items():
                trace = trio.run(one_conversation, url, text, voice, pages)
                cell = out[side][chars]
                if trace.error or math.isnan(trace.handshake_at):
                    cell["errors"].append(trace.error or trace.server_error)
                    continue
                cell["handshake_s"].append(trace.handshake_at - trace.connect_at)
                cell["first_audio_s"].append(trace.audio_at[0] - trace.connect_at if trace.audio_at else math.nan)
                logger.info("%s, %d chars: handshake %.3f s", side, chars, cell["handshake_s"][-1])
    return out


def median(values: list[float]) -> float:
    finite = sorted(v for v in values if not math.isnan(v))
    return finite[len(finite) // 2] if finite else math.nan


async def joins_under_load(
    url: str, live: int, joiners: int, rounds: int, pages: list[bytes], text: str, voice: str
) -> dict:
    """``live`` talk; ``rounds`` times ``joiners`` join at once (each waits for its handshake, then leaves).

    The live ones' tick lateness is read over the joining intervals (from the joins to the last handshake,
    when the prompts run) and over as many ticks just before each, the same run.
    """
    stats = [load.ClientStats(i) for i in range(live)]
    ready, stop = trio.Semaphore(0), trio.Event()
    query = f"text_prompt={text.replace(' ', '%20')}&voice_prompt={voice}"
    ws_url = url.replace("http://", "ws://") + "/api/chat?" + query
    lateness = "pplex_tick_lateness_seconds"
    before, during = Histogram([], []), Histogram([], [])
    handshakes: list[float] = []
    errors: list[str] = []
    async with trio.open_nursery() as nursery:
        for s in stats:
            nursery.start_soon(
                lambda s=s: load.run_client(
                    ws_url,
                    pages,
                    40,
                    s,
                    decode=False,
                    live=ready,
                    stop=stop,
                    started_at=trio.current_time(),
                    random_phase=load.spread(s.index, 0.25),
                )
            )
        with trio.fail_after(120):
            for _ in range(live):
                await ready.acquire()
        await trio.sleep(2.0)
        for _ in range(rounds):
            mark = parse(await fetch_text(url))
            t0 = trio.current_time()
            traces = [client.Trace(i) for i in range(joiners)]
            async with trio.open_nursery() as joining:
                for trace in traces:
                    joining.start_soon(
                        lambda t=trace, t0=t0: client.converse(
                            client.chat_url(url, text_prompt=text, voice_prompt=voice),
                            pages,
                            t,
                            clock=lambda: trio.current_time() - t0,
                            stream_pages=0,
                            wait_timeout=60,
                            drain=0.0,
                        )
                    )
            joined = parse(await fetch_text(url))
            interval = trio.current_time() - t0
            handshakes += [t.handshake_at - t.connect_at for t in traces if not math.isnan(t.handshake_at)]
            errors += [t.error for t in traces if t.error]
            during = _add(during, Histogram.between(mark, joined, lateness))
            await trio.sleep(1.0)  # the joiners' slots drain
            quiet = parse(await fetch_text(url))
            await trio.sleep(interval)
            before = _add(before, Histogram.between(quiet, parse(await fetch_text(url)), lateness))
        stop.set()
    handshakes.sort()
    return {
        "live": live,
        "joiners": joiners,
        "rounds": rounds,
        "joiners_handshake_p50_s": client.quantile(handshakes, 0.5) if handshakes else math.nan,
        "joiners_handshake_p99_s": client.quantile(handshakes, 0.99) if handshakes else math.nan,
        "joiners_ok": len(handshakes),
        "joiner_errors": errors[:5],
        "live_ticks_measured": [before.count, during.count],
        "live_lateness_p99_ms_alone": 1000 * before.quantile(0.99),
        "live_lateness_p99_ms_while_joining": 1000 * during.quantile(0.99),
        "live_ticks_over_5ms_alone": _over(before, 0.005),
        "live_ticks_over_5ms_while_joining": _over(during, 0.005),
        "live_ok": sum(not s.error for s in stats),
    }


def _over(h: Histogram, bound: float) -> float:
    """The ticks later than ``bound`` (a bucket bound of the histogram)."""
    return h.count - dict(zip(h.bounds, h.counts)).get(bound, h.count)


def _add(a: Histogram, b: Histogram) -> Histogram:
    if not a.bounds:
        return b
    return Histogram(b.bounds, [x + y for x, y in zip(a.counts, b.counts)])


async def first_words(url: str, speech: np.ndarray, seconds: float = 3.0) -> dict:
    """A Realtime SDK client that talks from its first append; how much of its first ``seconds`` the echo returns.

    asyncio, as the SDK is (the rest of this benchmark runs on Trio).
    """
    import asyncio
    import base64

    from openai import AsyncOpenAI

    rate, chunk = 24_000, 1920
    loud = np.flatnonzero(np.abs(speech) > 10 ** (-42 / 20))
    onset = int(loud[0]) if loud.size else 0  # the recording's leading silence is not the caller's first words
    said = speech[onset : onset + int(seconds * rate)]
    question = np.concatenate([said, np.zeros(2 * rate, np.float32)])  # 2 s to hear the rest
    base = url.rstrip("/") + "/v1"
    sdk = AsyncOpenAI(api_key="unused", base_url=base, websocket_base_url=base.replace("http", "ws", 1))
    answer: list[bytes] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    live_at = math.nan
    async with sdk.realtime.connect(model="personaplex") as connection:
        await connection.session.update(
            session={
                "type": "realtime",
                "instructions": persona(100),
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}}},
            }
        )

        async def listen() -> None:
            nonlocal live_at
            async for event in connection:
                if event.type == "response.created" and math.isnan(live_at):
                    live_at = loop.time() - t0
                elif event.type == "response.output_audio.delta":
                    answer.append(base64.b64decode(event.delta))

        listener = asyncio.create_task(listen())
        start = loop.time()
        for i in range(0, question.size, chunk):  # from the first append on, as LiveKit and Pipecat do
            pcm16 = (np.clip(question[i : i + chunk], -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
            await connection.input_audio_buffer.append(audio=base64.b64encode(pcm16).decode())
            await asyncio.sleep(max(0.0, start + (i // chunk + 1) * 0.08 - loop.time()))
        await asyncio.sleep(0.5)
        listener.cancel()
    await sdk.close()
    heard = np.frombuffer(b"".join(answer), "<i2").astype(np.float32) / 32768
    frames = [said[i : i + chunk] for i in range(0, said.size - chunk + 1, chunk)]
    speech_frames = [f for f in frames if np.sqrt(np.mean(f.astype(np.float64) ** 2)) > 10 ** (-42 / 20)]
    matches = [best_match(f, heard) for f in speech_frames]
    found = sum(m > MATCH for m in matches)
    return {
        "seconds_said": seconds,
        "live_after_s": live_at,
        "speech_frames": len(speech_frames),
        "heard_frames": int(found),
        "heard_share": found / max(1, len(speech_frames)),
        "best_matches": [round(m, 4) for m in matches],
    }


def best_match(frame: np.ndarray, audio: np.ndarray) -> float:
    """The highest normalised correlation of ``frame`` with any stretch of ``audio`` (FFT cross-correlation)."""
    if audio.size < frame.size:
        return 0.0
    n = 1 << int(np.ceil(np.log2(audio.size + frame.size)))
    xcorr = np.fft.irfft(np.fft.rfft(audio, n) * np.conj(np.fft.rfft(frame, n)), n)[: audio.size - frame.size + 1]
    energy = np.convolve(audio.astype(np.float64) ** 2, np.ones(frame.size), "valid")
    own = float(np.sum(frame.astype(np.float64) ** 2))
    comparable = energy > 0.25 * own  # an echo has the frame's energy; near-silence would divide by ~0
    if not comparable.any():
        return 0.0
    return float(np.max(xcorr[comparable] / np.sqrt(energy[comparable] * own)))


def table(result: dict) -> str:
    rows = [["persona chars", "server", "handshake p50 s", "first audio p50 s", "ok", "ours/theirs"]]
    sides = result["personas"]
    for chars in PERSONA_LENGTHS:
        for side in sides:
            cell = sides[side][str(chars)] if str(chars) in sides[side] else sides[side][chars]
            ratio = ""
            if side == "ours" and "nvidia" in sides:
                theirs = sides["nvidia"].get(str(chars)) or sides["nvidia"].get(chars)
                ratio = f"{median(cell['handshake_s']) / median(theirs['handshake_s']):.3f}"
            rows.append(
                [
                    str(chars),
                    side,
                    f"{median(cell['handshake_s']):.3f}",
                    f"{median(cell['first_audio_s']):.3f}",
                    f"{len(cell['handshake_s'])}",
                    ratio,
                ]
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--checkpoint",
        type=pathlib.Path,
        default=GOLDEN,
        help="a PersonaPlex-layout checkpoint folder (default ../shared/golden/tiny-public)",
    )
    p.add_argument("--voice", default="TINY0.pt", help="the voice prompt (default TINY0.pt, the golden checkpoint's)")
    p.add_argument("--personaplex", type=pathlib.Path, help="a checkout of NVIDIA/personaplex: also measure its server")
    p.add_argument(
        "--personaplex-venv",
        type=pathlib.Path,
        default=PERSONAPLEX_VENV,
        help="the venv NVIDIA's server runs in (made on first use)",
    )
    p.add_argument("--repeats", type=int, default=3, help="conversations per persona length and server (default 3)")
    p.add_argument("--load", action="store_true", help="measure joins under load instead (ours, the echo engine)")
    p.add_argument("--live", type=int, default=32)
    p.add_argument("--joiners", type=int, default=8)
    p.add_argument("--step-ms", type=float, default=20.0, help="with --load: the echo engine's tick compute")
    p.add_argument("--rounds", type=int, default=8, help="with --load: how many times the joiners join")
    p.add_argument("--prompt-positions", type=int, default=100, help="with --load: each joiner's prompt (default 100)")
    p.add_argument(
        "--first-words",
        action="store_true",
        help="measure how much of a Realtime client's first 3 s is heard instead (the echo engine)",
    )
    p.add_argument(
        "--server-checkout",
        type=pathlib.Path,
        default=REPO,
        help="with --first-words: run the server from this checkout (default this one)",
    )
    p.add_argument("--name", default="ready")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    pages = load.encode_pages(40.0, 40)
    result: dict = {
        "command": " ".join(["python", "bench/ready.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpus": os.cpu_count(),
    }
    if args.load:
        result["load"] = {}
        for label, positions in (("prompts", args.prompt_positions), ("control, no prompt", 0)):
            echo = pathlib.Path(f"echo:step_ms={args.step_ms:g},text_share=0.3,prompt={positions}")
            server = start_ours(echo, "--slots", str(args.live + args.joiners), "--queue-size", "0")
            try:
                result["load"][label] = trio.run(
                    joins_under_load,
                    "http://" + server.address,
                    args.live,
                    args.joiners,
                    args.rounds,
                    pages,
                    persona(100),
                    "NATF0.pt",
                )
            finally:
                server.stop()
            print(label, json.dumps(result["load"][label], indent=1), flush=True)
    elif args.first_words:
        commit = subprocess.run(
            ["git", "-C", str(args.server_checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        server = start_ours(pathlib.Path("echo:step_ms=10"), "--slots", "1", source=args.server_checkout)
        try:
            speech = load.speech(10.0)
            import asyncio

            result["first_words"] = asyncio.run(first_words("http://" + server.address, speech)) | {"commit": commit}
        finally:
            server.stop()
        print(json.dumps(result["first_words"], indent=1))
    else:
        servers = {"ours": start_ours(args.checkpoint, "--slots", "2")}
        try:
            if args.personaplex:
                result["personaplex_venv"] = ensure_personaplex_venv(args.personaplex, args.personaplex_venv)
                result["personaplex_commit"] = subprocess.run(
                    ["git", "-C", str(args.personaplex), "rev-parse", "HEAD"], capture_output=True, text=True
                ).stdout.strip()
                servers["nvidia"] = start_personaplex(args.personaplex, args.checkpoint, args.personaplex_venv)
            urls = {side: "http://" + proc.address for side, proc in servers.items()}
            result["personas"] = personas(urls, args.voice, args.repeats, pages)
        finally:
            for proc in servers.values():
                proc.stop()
        print(table(result))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
