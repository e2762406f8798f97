#!/usr/bin/env python3
"""bench/voices: what making a voice from a clip costs, and what it costs the live conversations.

* **cost** (always): a clip of real speech made into a voice, ``--repeats``
  times each at 4 s and 30 s, on the tiny model and the golden checkpoint
  (CPU): reading and bringing it to -24 LUFS, then the voice itself as we
  make it (Mimi and the embeddings: ``VoiceMaking``) beside the reference's
  way (one LM step of the transformer per frame as well, as NVIDIA's
  ``LMGen`` runs it); milliseconds per second of clip, and the ratio.
* **live** (``--live N``, default 1): ``pplex-trio serve --model tiny``; N
  conversations talk (real speech, the official client's traffic) while ten
  4 s voices are added over HTTP (four uploads at a time, the server's own
  limit); their tick lateness (p99, and ticks over 5 ms) while the voices are
  made, beside 20 s just before (nothing added), from the server's histograms;
  and how long each upload took.

Usage (from the repository root)::

    python bench/voices.py [--repeats 5] [--live 1]

Prints the tables and writes ``bench/results/voices.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np
import sphn
import torch
import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import load  # noqa: E402
from _metrics import Histogram, fetch_text, parse  # noqa: E402
from _serverproc import ServerProcess  # noqa: E402

from pplex_trio.codec._voice_audio import voice_audio  # noqa: E402
from pplex_trio.model import load_model  # noqa: E402
from pplex_trio.model._lockstep import LMGen, StepInputs  # noqa: E402
from pplex_trio.model._voices import VoiceMaking  # noqa: E402

logger = logging.getLogger("bench.voices")
GOLDEN = REPO.parent / "shared" / "golden" / "tiny-public"
RESULTS = REPO / "bench" / "results"
CLIP_SECONDS = (4.0, 30.0)
ALONE_SECONDS = 20.0  # the live conversations alone, just before the voices are added


def clip_file(folder: pathlib.Path, seconds: float) -> pathlib.Path:
    path = folder / f"speech-{seconds:g}s.wav"
    sphn.write_wav(str(path), load.speech(seconds), 24_000)
    return path


@torch.no_grad()
def reference_way(model, pcm: np.ndarray) -> None:
    """The reference's voice generation: Mimi per frame, then an LM step (transformer, no depformer) per frame."""
    lm, mimi, p = model.lm, model.mimi, model.config.prompt
    size = mimi.frame_size
    frames = -(-len(pcm) // size)
    padded = np.zeros(frames * size, np.float32)
    padded[: len(pcm)] = pcm
    state = mimi.init_encoder_state(1)
    gen = LMGen(lm, 1)
    ones = torch.ones(1, dtype=torch.bool)
    for i in range(frames):
        codes = mimi.encode_frame(torch.from_numpy(padded[i * size : (i + 1) * size])[None], state)
        if i:
            tokens = torch.cat([torch.tensor([p.zero_text_code]), codes[0], torch.tensor(p.sine_tokens)])[None]
            gen.step(StepInputs(tokens=tokens, exec_mask=ones), run_depformer=False, return_embeddings=True)


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def cost(repeats: int, folder: pathlib.Path) -> list[dict]:
    torch.set_num_threads(1)  # as the server runs a small model on the CPU
    rows = []
    for source in ("tiny", str(GOLDEN)):
        model = load_model(source)
        p = model.config.prompt
        for seconds in CLIP_SECONDS:
            path = clip_file(folder, seconds)
            pcm = voice_audio(path, 24_000, max_seconds=31)
            prepare = timed(lambda: voice_audio(path, 24_000, max_seconds=31), repeats)

            def ours():
                making = VoiceMaking(model.lm, model.mimi, pcm, p.sine_tokens, p.zero_text_code)
                making.advance(making.frames_total)
                making.result()

            made = timed(ours, repeats)
            reference = timed(lambda: reference_way(model, pcm), repeats)
            rows.append(
                {
                    "model": model.name if source == "tiny" else "golden tiny-public",
                    "clip_s": seconds,
                    "read_normalise_ms_per_s": 1000 * prepare / seconds,
                    "ours_ms_per_s": 1000 * made / seconds,
                    "reference_way_ms_per_s": 1000 * reference / seconds,
                    "ours_per_frame_ms": 1000 * made / (seconds / 0.08),
                }
            )
            logger.info("%s", rows[-1])
    return rows


async def live_while_adding(url: str, live: int, clip: bytes, voices: int = 10, workers: int = 4) -> dict:
    import httpx

    stats = [load.ClientStats(i) for i in range(live)]
    ready, stop = trio.Semaphore(0), trio.Event()
    pages = load.encode_pages(60.0, 40)
    ws_url = url.replace("http://", "ws://") + "/api/chat?voice_prompt=NATF0.pt"
    lateness = "pplex_tick_lateness_seconds"
    took: list[float] = []
    statuses: list[int] = []
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
        names = iter(range(voices))
        async with httpx.AsyncClient(timeout=180) as http:
            quiet = parse(await fetch_text(url))
            await trio.sleep(ALONE_SECONDS)
            mark = parse(await fetch_text(url))
            alone = Histogram.between(quiet, mark, lateness)
            t0 = trio.current_time()

            async def worker():
                for i in names:
                    began = trio.current_time()
                    response = await http.post(
                        url + "/api/voices",
                        params={"name": f"Bench{i}"},
                        content=clip,
                        headers={"content-type": "audio/wav"},
                    )
                    statuses.append(response.status_code)
                    took.append(trio.current_time() - began)

            async with trio.open_nursery() as uploads:
                for _ in range(workers):
                    uploads.start_soon(worker)
            added = parse(await fetch_text(url))
            interval = trio.current_time() - t0
            during = Histogram.between(mark, added, lateness)
        stop.set()
    took.sort()
    return {
        "live": live,
        "voices": voices,
        "statuses": sorted(set(statuses)),
        "added": statuses.count(201),
        "adding_s": interval,
        "upload_p50_s": took[len(took) // 2],
        "upload_max_s": took[-1],
        "ticks_measured": [alone.count, during.count],
        "lateness_p99_ms_alone": 1000 * alone.quantile(0.99),
        "lateness_p99_ms_while_adding": 1000 * during.quantile(0.99),
        "ticks_over_5ms_alone": _over(alone, 0.005),
        "ticks_over_5ms_while_adding": _over(during, 0.005),
        "live_ok": sum(not s.error for s in stats),
    }


def _over(h: Histogram, bound: float) -> float:
    return h.count - dict(zip(h.bounds, h.counts)).get(bound, h.count)


def table(result: dict) -> str:
    lines = [
        "making a voice (CPU, one torch thread), ms per second of clip (median):",
        f"{'model':<20}{'clip':>6}{'read+LUFS':>11}{'ours':>9}{'reference way':>15}{'ratio':>8}",
    ]
    for row in result["cost"]:
        ratio = row["ours_ms_per_s"] / row["reference_way_ms_per_s"]
        lines.append(
            f"{row['model'][:19]:<20}{row['clip_s']:>5g}s{row['read_normalise_ms_per_s']:>11.1f}"
            f"{row['ours_ms_per_s']:>9.1f}{row['reference_way_ms_per_s']:>15.1f}{ratio:>8.2f}"
        )
    live = result.get("live")
    if live:
        lines += [
            "",
            f"{live['live']} live conversation(s) while {live['voices']} voices of 4 s are added "
            f"({live['added']} added, statuses {live['statuses']}, in {live['adding_s']:.1f} s; an upload "
            f"took {live['upload_p50_s']:.2f} s median, {live['upload_max_s']:.2f} s at most):",
            f"{'':<16}{'ticks':>7}{'lateness p99':>14}{'over 5 ms':>11}",
            f"{'alone':<16}{live['ticks_measured'][0]:>7.0f}{live['lateness_p99_ms_alone']:>12.2f}ms"
            f"{live['ticks_over_5ms_alone']:>11.0f}",
            f"{'while adding':<16}{live['ticks_measured'][1]:>7.0f}{live['lateness_p99_ms_while_adding']:>12.2f}ms"
            f"{live['ticks_over_5ms_while_adding']:>11.0f}",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--live", type=int, default=1, help="live conversations while the voices are added (0: skip)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        result["cost"] = cost(args.repeats, folder)
        if args.live:
            clip = clip_file(folder, 4.0).read_bytes()
            server = ServerProcess(
                [
                    "-m",
                    "pplex_trio",
                    "serve",
                    "--model",
                    "tiny",
                    "--device",
                    "cpu",
                    "--port",
                    "0",
                    "--voice-store",
                    str(folder / "store"),
                ],
                startup_timeout=300,
            )
            try:
                result["live"] = trio.run(live_while_adding, "http://" + server.address, args.live, clip)
            except BaseException:
                logger.error("the server's log:\n%s", "".join(server.log[-40:]))
                raise
            finally:
                server.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "voices.json").write_text(
        json.dumps(result, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v)
    )
    print(table(result))  # the benchmark's report
    return 0


if __name__ == "__main__":
    sys.exit(main())
