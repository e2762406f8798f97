"""bench/gpu/run's engine steps in one process: the model is built once, then equality, sweep, the transcriber's
cost, prefill, profile, dispatch and precision.

Run by bench/gpu/run (not meant to be run by hand); it writes its results to
``--out`` (JSON) after every piece, so whatever finished survives a kill.
Each step has a time box (``--boxes``, seconds): the sweep skips the cells
its box has no time left for and says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import pathlib
import sys
import tempfile
import time
import traceback
from typing import Any

import numpy as np
import torch

from pplex_trio.engine._device_tick import DeviceTick
from pplex_trio.engine._fit import GIB, plan_memory
from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import CONFIGS, random_model

logger = logging.getLogger("bench.gpu.engine")
PERSONA = "You enjoy having a good conversation. Have a deep conversation about technology. Your name is Jane."
ATTENTION_KERNELS = ("fmha", "flash", "attention", "efficient", "cudnn", "sdpa")


class Results:
    """A JSON object on disk, rewritten (atomically) after every update."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.data: dict[str, Any] = {}

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {
        "allocated_gib": torch.cuda.memory_allocated(device) / GIB,
        "reserved_gib": torch.cuda.memory_reserved(device) / GIB,
        "max_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        "driver_free_gib": free / GIB,
        "driver_total_gib": total / GIB,
    }


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def speech_frames(folder: pathlib.Path | None, count: int = 64) -> np.ndarray:
    """``[count, 1920]`` frames of real speech (the wheelhouse's copies), or of a voice-like synthetic."""
    wavs = sorted(folder.glob("speech_*.wav")) if folder and folder.is_dir() else []
    if wavs:
        import sphn

        pcm = sphn.read(str(wavs[0]), sample_rate=24_000)[0][0]
    else:
        t = np.arange(count * 1920) / 24_000
        pcm = 0.2 * np.sin(2 * np.pi * (140 + 40 * np.sin(2 * np.pi * 0.7 * t)) * t)
    pcm = np.resize(pcm.astype(np.float32), count * 1920)
    return pcm.reshape(count, 1920)


class Driver:
    """Drives one engine like the actor does: starts, prompts between ticks (``prompt_chunk`` positions a row
    per gap), LIVE once a prompt is done."""

    def __init__(self, engine: PersonaPlexEngine, frames: np.ndarray, prompt_chunk: int = 1 << 30):
        self.engine = engine
        self.frames = frames
        self.prompt_chunk = prompt_chunk
        self.left: list[int | None] = [None] * engine.num_slots  # prompt positions left; None: idle
        self.ticks = 0

    def start(self, row: int, conversation: Conversation) -> None:
        self.left[row] = self.engine.start(row, conversation)

    def reset(self, row: int) -> None:
        self.engine.reset(row)
        self.left[row] = None

    def modes(self) -> list[SlotMode]:
        return [SlotMode.LIVE if n == 0 else SlotMode.IDLE for n in self.left]

    def prompts(self) -> None:
        work = {row: self.prompt_chunk for row, n in enumerate(self.left) if n}
        for row, done in (self.engine.prefill(work) if work else {}).items():
            self.left[row] -= done  # type: ignore[operator]

    def step(self) -> tuple[list[SlotMode], Any]:
        self.prompts()
        modes = self.modes()
        b = self.engine.num_slots
        pcm = np.stack([self.frames[(self.ticks + 7 * r) % len(self.frames)] for r in range(b)])
        out = self.engine.step(modes, pcm)
        self.ticks += 1
        return modes, out

    def live(self) -> bool:
        return all(n == 0 for n in self.left if n is not None)


# --- (b) eager against the CUDA graph ------------------------------------------------


def every_part(engine: PersonaPlexEngine) -> PersonaPlexEngine:
    """``engine`` with eager ticks that run what the graph records: every part, every tick.

    (The engine draws the sampling noise only when a LIVE row samples.)
    """
    tick = engine._tick
    tick.run = lambda *, sample, listen=True: DeviceTick.run(tick, sample=True, listen=listen)
    return engine


def equality(model, device: torch.device, frames: np.ndarray, quick: bool) -> dict[str, Any]:
    """The same script on an eager engine and on a graph engine (on CPU: eager with every part on)."""
    cuda = device.type == "cuda"
    eager = PersonaPlexEngine(model, 4, cuda_graph=False)
    if cuda:
        other = PersonaPlexEngine(model, 4, cuda_graph=True)
        label = "cuda_graph"
    else:
        other = every_part(PersonaPlexEngine(model, 4, cuda_graph=False))
        label = "eager, every part on (no CUDA here)"
    drivers = [Driver(eager, frames, prompt_chunk=16), Driver(other, frames, prompt_chunk=16)]
    greedy, sampled = Sampling(greedy=True), Sampling(text_seed=1, audio_seed=2)
    voices = model.voices.names()
    script = {0: [("start", 0, voices[0], greedy), ("start", 1, voices[1 % len(voices)], sampled)]}
    live_at = None
    mismatch, worst_pcm, compared, all_live = None, 0.0, 0, 0
    for tick in range(3000):
        if live_at is None and all(d.left[0] == 0 and d.left[1] == 0 for d in drivers):
            live_at = tick
            script[tick + 3] = [("start", 2, voices[2 % len(voices)], Sampling(text_seed=3, audio_seed=4))]
            script[tick + 8] = [("reset", 0), ("start", 0, voices[0], greedy)]
            script[tick + 9] = [("start", 3, voices[-1], Sampling(text_seed=5, audio_seed=6))]
        for event in script.get(tick, []):
            for d in drivers:
                if event[0] == "reset":
                    d.reset(event[1])
                else:
                    d.start(event[1], Conversation(persona=PERSONA, voice=event[2], sampling=event[3]))
        results = [d.step() for d in drivers]
        modes = results[0][0]
        tokens = [d.engine.last_tokens.copy() for d in drivers]
        for row, mode in enumerate(modes):
            if mode is SlotMode.LIVE:
                compared += 1
                if mismatch is None and not np.array_equal(tokens[0][row], tokens[1][row]):
                    mismatch = {
                        "tick": tick,
                        "row": row,
                        "eager": tokens[0][row].tolist(),
                        label: tokens[1][row].tolist(),
                    }
                diff = float(np.abs(results[0][1].pcm[row] - results[1][1].pcm[row]).max())
                worst_pcm = max(worst_pcm, diff)
        if live_at is not None and tick > live_at + 9 and all(d.live() for d in drivers):
            all_live += 1
            if all_live == (10 if quick else 30):  # ticks with every row live, after the last start
                break
    return {
        "compared": label,
        "tick_path": other.tick_path,
        "ticks": drivers[0].ticks,
        "live_frames_compared": compared,
        "tokens_equal": mismatch is None,
        "first_mismatch": mismatch,
        "pcm_max_abs_diff": worst_pcm,
    }


# --- (c) the sweep -------------------------------------------------------------------

MODES: dict[str, dict[str, bool]] = {
    "eager": {"cuda_graph": False},
    "graph": {"cuda_graph": True},
    "compiled": {"cuda_graph": True, "compile": True},
}
"""A sweep cell's mode -> ``PersonaPlexEngine``'s arguments ("compiled": torch.compile's tick, recorded as a graph)."""


def cell(
    model, batch: int, mode: str, frames: np.ndarray, timed: int, warmup: int, transcriber: Any = None
) -> dict[str, Any]:
    """ms per tick of ``batch`` live rows in ``mode``; ``transcriber`` (a ``LoadedTranscriber``) stepped in the same
    tick when given."""
    device = model.device
    release(device)
    began = time.perf_counter()
    engine = PersonaPlexEngine(model, batch, default_voice="", transcriber=transcriber, **MODES[mode])
    sync(device)
    out: dict[str, Any] = {
        "B": batch,
        "mode": mode,
        "tick_path": engine.tick_path,
        "build_and_capture_s": time.perf_counter() - began,
    }
    driver = Driver(engine, frames)
    for row in range(batch):
        driver.start(row, Conversation(persona="Hello.", sampling=Sampling(text_seed=row, audio_seed=row)))
    began = time.perf_counter()
    driver.prompts()
    sync(device)
    out["prompts_ms"] = 1000 * (time.perf_counter() - began)  # every row's prompt, one prefill call
    began = time.perf_counter()
    driver.step()
    sync(device)
    out["first_live_tick_ms"] = 1000 * (time.perf_counter() - began)
    for _ in range(warmup):
        driver.step()
    ms = []
    for _ in range(timed):
        sync(device)
        began = time.perf_counter()
        driver.step()  # engine.step ends with the read-back, its one sync
        ms.append(1000 * (time.perf_counter() - began))
    out.update(
        ticks=timed,
        p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)),
        max_ms=float(np.max(ms)),
        **memory(device),
    )
    del driver, engine
    release(device)
    return out


def sweep(
    model,
    frames: np.ndarray,
    batches: list[int],
    modes: list[str],
    timed: int,
    warmup: int,
    deadline: float,
    results: Results,
) -> None:
    """Every batch in every mode; the compiled cells (minutes of compiling each) after all the others, so that
    the time box leaves those out first."""
    cells: list[dict[str, Any]] = []
    longest = 0.0
    order = [(b, m) for b in batches for m in modes if m != "compiled"] + [
        (b, "compiled") for b in batches if "compiled" in modes
    ]
    for batch, mode in order:
        name = {"B": batch, "mode": mode}
        left = deadline - time.monotonic()
        if left < 1.5 * longest:
            cells.append(name | {"skipped": f"time box: {left:.0f} s left, the slowest cell took {longest:.0f} s"})
            results.put("sweep", cells)
            continue
        began = time.monotonic()
        try:
            cells.append(cell(model, batch, mode, frames, timed, warmup))
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded, the sweep goes on
            logger.warning("B=%d %s: %s", batch, name["mode"], exc)
            cells.append(
                name
                | {
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                    "out_of_memory": isinstance(exc, torch.OutOfMemoryError),
                }
            )
            release(model.device)
        longest = max(longest, time.monotonic() - began)
        logger.info("sweep: %s", json.dumps(cells[-1], default=str))
        results.put("sweep", cells)


# --- (c*) the transcriber's cost: the tick with and without the speech-to-text model ----------------------


def stt_structure(model) -> Any:
    """Kyutai's ``kyutai/stt-1b-en_fr`` as a random-weight ``LoadedTranscriber`` at its real widths (no download):
    its config's shapes (2048 wide, 16 layers of 16 heads, 32 codebooks, 4 extra heads, 8000 text tokens, 750
    frames of context), reading the model's Mimi codes, the LM in the model's dtype.  On a small config (``tiny``)
    the tiny speech-to-text model, as ``serve --transcribe tiny`` runs it."""
    from pplex_trio.model import LoadedTranscriber, Mimi, SpeechToText, STTConfig, load_transcriber

    if model.config.lm.dim < 1024:
        return load_transcriber("tiny-stt", device=model.device)
    cfg = STTConfig(
        name="stt-1b-en_fr structure (random weights)",
        card=model.config.lm.card,
        extra_heads_num_heads=4,
        mimi=model.config.mimi,
    )
    torch.manual_seed(47)
    with torch.device(model.device):
        stt = SpeechToText(cfg)
    stt = stt.to(model.lm.dtype).eval()
    with torch.device("meta"):
        mimi = Mimi(cfg.mimi)  # (never run: the engine's Mimi encode serves the transcriber)
    return LoadedTranscriber(cfg, stt, mimi, model.tokenizer, model.device)


def transcriber_step(model, frames: np.ndarray, quick: bool, deadline: float) -> dict[str, Any]:
    """ms per tick without and with the transcriber at B = 1, 16 and 64 (quick: 1 and 4), each pair side by side
    (graph on CUDA, as ``serve`` runs; eager elsewhere), and their ratio.  A pair the box has no time left for is
    skipped and says so; a transcriber that cannot be built skips the step with the reason."""
    device = model.device
    began = time.perf_counter()
    try:
        loaded = stt_structure(model)
    except Exception as exc:  # noqa: BLE001 - recorded: the step cannot run
        release(device)
        return {"skipped": f"the transcriber could not be built: {type(exc).__name__}: {str(exc)[:300]}"}
    sync(device)
    out: dict[str, Any] = {
        "transcriber": loaded.name,
        "parameters": sum(t.numel() for t in loaded.model.parameters()),
        "lm_dtype": str(next(loaded.model.parameters()).dtype),
        "seconds_to_build": time.perf_counter() - began,
        "weights": "random: its config's shapes (a tick's cost does not depend on the weights' values)",
        "cells": [],
    }
    mode = "graph" if device.type == "cuda" else "eager"
    batches = [1, 4] if quick else [1, 16, 64]
    timed, warmup = (20, 3) if quick else (100, 10)
    longest = 0.0
    for batch in batches:
        left = deadline - time.monotonic()
        if left < 1.5 * longest:
            for stt in ("off", loaded.name):
                out["cells"].append(
                    {"B": batch, "mode": mode, "transcriber": stt, "skipped": f"time box: {left:.0f} s left"}
                )
            continue
        pair_began = time.monotonic()
        pair: dict[bool, dict[str, Any]] = {}
        for stt in (None, loaded):
            name = {"B": batch, "mode": mode, "transcriber": "off" if stt is None else loaded.name}
            try:
                pair[stt is not None] = name | cell(model, batch, mode, frames, timed, warmup, transcriber=stt)
            except Exception as exc:  # noqa: BLE001 - a failing cell is recorded, the others go on
                pair[stt is not None] = name | {
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                    "out_of_memory": isinstance(exc, torch.OutOfMemoryError),
                }
                release(device)
            out["cells"].append(pair[stt is not None])
        if all("p50_ms" in c for c in pair.values()):
            pair[True]["p50_ratio"] = pair[True]["p50_ms"] / pair[False]["p50_ms"]
            pair[True]["p99_ratio"] = pair[True]["p99_ms"] / pair[False]["p99_ms"]
        for c in out["cells"][-2:]:
            logger.info("transcriber: %s", json.dumps(c, default=str))
        longest = max(longest, time.monotonic() - pair_began)
    del loaded
    release(device)
    return out


# --- (c'') the 8-bit choices: --kv-cache fp8, --quantize int8 --------------------------------


def precision_step(model, config: str, frames: np.ndarray, quick: bool, deadline: float) -> dict[str, Any]:
    """Each 8-bit choice: ms per tick at B=1 and B=64 (eager and graph on CUDA), memory, and ``compare``
    against the bf16 model on 100 steps of speech (teacher-forced; random weights, so the agreement says
    how large the numerical error is, not how the real model sounds).  Runs last: it quantizes in place."""
    from pplex_trio._precision import KVFormat, Precision, WeightFormat
    from pplex_trio.engine._compare import compare

    cuda = model.device.type == "cuda"
    batches, modes = ([1, 4], ["eager"]) if quick else ([1, 64], ["eager", "graph"] if cuda else ["eager"])
    timed, warmup = (10, 2) if quick else (100, 10)
    out: dict[str, Any] = {"cells": [], "compare": []}
    quantized = random_model(CONFIGS[config], model.device)  # the same seed: the same weights, to quantize
    for precision in (
        Precision(kv_cache=KVFormat.FP8),
        Precision(WeightFormat.INT8, KVFormat.FP8),
        Precision(WeightFormat.INT8),
    ):
        target = model if precision.weights is WeightFormat.NONE else quantized
        target.lm.set_precision(precision)
        for batch in batches:
            for mode in modes:
                if time.monotonic() > deadline:
                    out["cells"].append({"precision": precision.describe(), "B": batch, "skipped": "time box"})
                    continue
                try:
                    out["cells"].append(
                        {"precision": precision.describe(), **cell(target, batch, mode, frames, timed, warmup)}
                    )
                except Exception as exc:  # noqa: BLE001 - recorded, the next cell runs
                    out["cells"].append(
                        {
                            "precision": precision.describe(),
                            "B": batch,
                            "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                        }
                    )
                    release(model.device)
                logger.info("precision: %s", json.dumps(out["cells"][-1], default=str))
        if time.monotonic() < deadline and precision.weights is WeightFormat.INT8:
            model.lm.set_precision(Precision())
            pcm = np.resize(frames.reshape(-1), (20 if quick else 100) * frames.shape[-1])
            conversation = Conversation(persona=PERSONA, sampling=Sampling(text_seed=1, audio_seed=2))
            result = compare(
                PersonaPlexEngine(model, 1, default_voice=""),
                PersonaPlexEngine(quantized, 1, default_voice=""),
                conversation,
                pcm,
            )
            out["compare"].append({"precision": precision.describe(), **result.summary()})
    return out


# --- (c') system prompts: chunked prefill -----------------------------------------------


def persona_of(engine: PersonaPlexEngine, positions: int, voice: str | None) -> tuple[str, int]:
    """A persona whose prompt (with ``voice``) is about ``positions`` long; returns it and its length."""
    words = "You enjoy having a good conversation about technology and science and the weather today".split()
    text, steps = "", 0
    while steps < positions:
        text += " " + words[len(text) % len(words)]
        steps = engine.start(0, Conversation(persona=text.strip(), voice=voice))
    return text.strip(), steps


def prefill(model, frames: np.ndarray, quick: bool, fit: int | None) -> dict[str, Any]:
    """ms to run one prompt of ~100 and ~300 positions: alone (B=1), and beside B-1 live rows."""
    device = model.device
    voice = model.voices.names()[0] if model.voices.names() else None
    beside = 3 if quick else min(63, max(1, (fit or 64) - 1))
    out: dict[str, Any] = {"voice_steps": model.voices.get(voice).num_steps if voice else 0, "cells": []}
    for batch in (1, beside + 1):
        release(device)
        engine = PersonaPlexEngine(model, batch)
        driver = Driver(engine, frames)
        for row in range(1, batch):  # the live ones, already talking
            driver.start(row, Conversation(persona="Hello.", voice=voice))
        for _ in range(3):
            driver.step()
        for target in (100,) if quick else (100, 300):
            persona, steps = persona_of(engine, target, voice)
            times = []
            for _ in range(2 if quick else 3):
                engine.start(0, Conversation(persona=persona, voice=voice))
                sync(device)
                began = time.perf_counter()
                engine.prefill({0: steps})
                sync(device)
                times.append(1000 * (time.perf_counter() - began))
                driver.step()  # a live tick between, as the actor does
            tick = []
            for _ in range(5):
                sync(device)
                began = time.perf_counter()
                driver.step()
                tick.append(1000 * (time.perf_counter() - began))
            out["cells"].append(
                {
                    "B": batch,
                    "live_beside": batch - 1,
                    "positions": steps,
                    "prompt_ms_median": float(np.median(times)),
                    "prompt_ms_all": times,
                    "live_tick_ms_median": float(np.median(tick)),
                }
            )
            logger.info("prefill: %s", out["cells"][-1])
        del driver, engine
    release(device)
    return out


# --- (d) one profiled tick ---------------------------------------------------------------


def profile(model, batch: int, frames: np.ndarray) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    device = model.device
    cuda = device.type == "cuda"
    engine = PersonaPlexEngine(model, batch, default_voice="", cuda_graph=False)
    driver = Driver(engine, frames)
    for row in range(batch):
        driver.start(row, Conversation(persona="Hello.", sampling=Sampling(text_seed=row, audio_seed=row)))
    for _ in range(3):
        driver.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        driver.step()
    events = prof.key_averages()
    if cuda:
        kernels = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        timed = lambda e: e.device_time_total  # noqa: E731
    else:
        kernels = [e for e in events if e.key.startswith("aten::")]
        timed = lambda e: e.self_cpu_time_total  # noqa: E731
    top = sorted(kernels, key=timed, reverse=True)[:12]
    total = sum(timed(e) for e in kernels)
    attention = sorted({e.key for e in kernels if any(word in e.key.lower() for word in ATTENTION_KERNELS)})
    del driver, engine
    release(device)
    return {
        "B": batch,
        "what": "CUDA kernels" if cuda else "CPU aten ops (no CUDA here)",
        "launches": int(sum(e.count for e in kernels)),
        "distinct": len(kernels),
        "total_ms": total / 1000,
        "top": [{"name": e.key[:120], "count": e.count, "ms": timed(e) / 1000} for e in top],
        "attention_kernels": attention,
        "math_attention": any("math" in k.lower() for k in attention),
    }


# --- (f) operations, kernels and syncs per tick -----------------------------------------------


def dispatch(model, batches: list[int]) -> dict[str, Any]:
    """``bench/kernels.py``'s count of one steady eager tick on this device: every operation dispatched, those
    that launch a kernel (views excluded, a fused library kernel once), and the host syncs among them."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    import kernels

    return {
        "what": "operations dispatched by one steady eager tick (bench/kernels.py's counter)",
        "ticks": {str(b): kernels.count_tick(model, b).as_dict(top=8) for b in batches},
    }


# --- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--config", default="personaplex-7b-v1")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--speech", type=pathlib.Path)
    p.add_argument(
        "--boxes", type=json.loads, required=True, help="seconds per step: build, equality, sweep, prefill, profile"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    results = Results(args.out)
    frames = speech_frames(args.speech)

    def step(name: str, fn, *fn_args) -> Any:
        began = time.monotonic()
        try:
            value = fn(*fn_args)
        except Exception as exc:  # noqa: BLE001 - recorded; the next step still runs
            logger.error("%s failed:\n%s", name, traceback.format_exc())
            value = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        if isinstance(value, dict):
            value["seconds"] = time.monotonic() - began
            results.put(name, value)
        return value

    # (a) the model, once, straight on the device
    voices = pathlib.Path(tempfile.mkdtemp(prefix="gpu-run-voices-"))

    def build() -> dict[str, Any]:
        began = time.perf_counter()
        model = random_model(CONFIGS[args.config], device, voice_dir=voices)
        sync(device)
        built["model"] = model
        plan = plan_memory(model.config, model.lm.dtype)
        free = torch.cuda.mem_get_info(device)[0] if cuda else None
        built["fit"] = plan.conversations_after_load(free, 2 * GIB) if free is not None else None
        return {
            "config": args.config,
            "seconds_to_build": time.perf_counter() - began,
            "lm_dtype": str(model.lm.dtype),
            "parameters": sum(t.numel() for t in model.lm.parameters()),
            "plan": plan.as_dict(int(free + plan.weights) if free else 0, 2 * GIB),
            "fit_max": built["fit"],
            **memory(device),
        }

    built: dict[str, Any] = {}
    step("build", build)
    model = built.get("model")
    if model is None:
        return 1
    step("equality", equality, model, device, frames, args.quick)

    if args.quick:
        batches = [1, 4]
        timed, warmup = 20, 3
    else:
        batches = sorted({1, 8, 16, 32, 48, 64, 80, *([built["fit"]] if built.get("fit") else [])})
        timed, warmup = 200, 20
    modes = ["eager", "graph", "compiled"] if cuda else ["eager"]
    if not cuda:
        results.put(
            "sweep_note",
            "no CUDA here: the graph and compiled cells need a GPU (torch.compile of the "
            "tick is inexact on the CPU: docs/BENCHMARKS.md, Kernels per tick)",
        )
    deadline = time.monotonic() + args.boxes["sweep"]
    began = time.monotonic()
    try:
        sweep(model, frames, batches, modes, timed, warmup, deadline, results)
    except Exception:  # noqa: BLE001
        logger.error("sweep failed:\n%s", traceback.format_exc())
    results.put("sweep_seconds", time.monotonic() - began)
    step("transcriber", transcriber_step, model, frames, args.quick, time.monotonic() + args.boxes["transcriber"])
    step("prefill", prefill, model, frames, args.quick, built.get("fit"))
    profile_batch = min(64, built.get("fit") or 64) if not args.quick else 4
    step("profile", profile, model, profile_batch, frames)
    step("dispatch", dispatch, model, [1, profile_batch])
    step(
        "precision", precision_step, model, args.config, frames, args.quick, time.monotonic() + args.boxes["precision"]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
