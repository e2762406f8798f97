"""``pplex-trio quantize`` (write a model with int8 weights) and ``pplex-trio compare`` (what a setting costs).

``compare`` is how a user checks quantization on the real weights, which
no test here can load: the same conversation at full precision and with
the chosen ``--quantize`` / ``--kv-cache``, the second teacher-forced on the
first's tokens (:mod:`pplex_trio.engine._compare`).
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib

from .._precision import Precision
from .._sources import DEFAULT_REPO
from ._offline import DEFAULT_PERSONA, add_precision_arguments, precision_of, read_frames, voice_location

logger = logging.getLogger(__name__)


def add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``quantize`` subcommand's arguments."""
    parser.add_argument(
        "--model",
        default=DEFAULT_REPO,
        help=f"'tiny', a Hugging Face repo id or a local folder (default {DEFAULT_REPO})",
    )
    parser.add_argument(
        "--output",
        required=True,
        type=pathlib.Path,
        help="folder to write: the model with its LM in int8, for `serve --model FOLDER`",
    )


def run_quantize(args: argparse.Namespace) -> int:
    """``pplex-trio quantize``: write the model with its LM in int8 to ``--output``; exit status 1 if the model cannot
    be read or written.
    """
    from ..model import CheckpointMismatchError, ModelAccessError, write_quantized

    try:
        lm = write_quantized(args.model, args.output)
    except (ModelAccessError, CheckpointMismatchError, OSError) as exc:
        logger.error("%s", exc)
        return 1
    logger.info("%s: %.2f GiB; serve it with --model %s", lm.name, lm.stat().st_size / 2**30, args.output)
    return 0


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``compare`` subcommand's arguments."""
    parser.add_argument(
        "--model",
        default=DEFAULT_REPO,
        help=f"'tiny', a Hugging Face repo id or a local folder (default {DEFAULT_REPO})",
    )
    add_precision_arguments(parser)
    parser.add_argument("--input-wav", required=True, help="the caller's audio (any rate, first channel used)")
    parser.add_argument("--text-prompt", default=DEFAULT_PERSONA, help="the persona (system prompt)")
    parser.add_argument("--voice-prompt", default=None, help="a voice of the model's library, or a file (as offline)")
    parser.add_argument("--voice-prompt-dir", default=None, help="use this folder as the voice library")
    parser.add_argument("--seed", type=int, default=0, help="the reference's sampling seed (default 0)")
    parser.add_argument("--device", default=None, help="cuda, cpu, cuda:1 ... (default: cuda if available)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the figures, per step included, to this file")


def run_compare(args: argparse.Namespace) -> int:
    """``pplex-trio compare``: run one conversation at full precision and at the chosen one and print what changed; exit
    status 2 when nothing is to be compared, 1 when the model, voice or input fails.
    """
    from ..engine import Conversation, PersonaPlexEngine, Sampling, compare
    from ..model import ModelAccessError, VoiceNotFoundError
    from ._engines import resolve_device

    chosen = precision_of(args)
    if chosen == Precision():
        logger.error("nothing to compare: pass --quantize int8 and/or --kv-cache fp8")
        return 2
    device = resolve_device(args.device or "auto")
    try:
        voice_dir, voice = voice_location(args.model, args.voice_prompt, args.voice_prompt_dir)
        reference, candidate = (
            PersonaPlexEngine.load(args.model, 1, device=device, voice_dir=voice_dir, precision=p)
            for p in (Precision(), chosen)
        )
        _audio, pcm = read_frames(args.input_wav, reference.sample_rate, reference.frame_size)
        sampling = Sampling(text_seed=args.seed, audio_seed=args.seed)
        result = compare(
            reference, candidate, Conversation(persona=args.text_prompt, voice=voice, sampling=sampling), pcm
        )
    except (ModelAccessError, VoiceNotFoundError, ValueError) as exc:
        logger.error("%s", exc)
        return 1
    summary = {
        "model": args.model,
        "device": str(device),
        "lm_dtype": str(reference.model.lm.dtype),
        "quantize": args.quantize,
        "kv_cache": args.kv_cache,
        "input": args.input_wav,
        **result.summary(),
    }
    print(table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "per_step": result.per_step()}, indent=1))
        logger.info("wrote %s", args.json)
    return 0


def table(s: dict) -> str:
    """The summary of a comparison, as text."""
    lines = [
        f"{s['model']} on {s['device']} ({s['lm_dtype'].removeprefix('torch.')}): --quantize {s['quantize']} "
        f"--kv-cache {s['kv_cache']} against full precision, teacher-forced on its tokens",
        f"{s['steps']} steps after a system prompt of {s['prompt_steps']}; first/last: {s['window_steps']} steps each",
        f"{'':8}{'text top-1':>12}{'audio top-1':>13}{'text KL':>10}{'audio KL':>10}",
    ]
    for part in ("all", "first", "last"):
        f = s[part]
        lines.append(f"{part:8}{f['text_top1']:12.3f}{f['audio_top1']:13.3f}{f['text_kl']:10.1e}{f['audio_kl']:10.1e}")
    lines.append("per codebook  top-1: " + " ".join(f"{a:.3f}" for a in s["audio_top1_per_codebook"]))
    lines.append("              KL:    " + " ".join(f"{k:.1e}" for k in s["audio_kl_per_codebook"]))
    lines.append(
        f"ms per step: full precision {s['reference_ms_per_step']:.1f}, "
        f"{s['quantize']}/{s['kv_cache']} {s['candidate_ms_per_step']:.1f} (median)"
    )
    return "\n".join(lines)
