"""``pplex-trio fit``: how many conversations of a model fit a GPU, and where its memory goes."""

from __future__ import annotations

import argparse
import json
import logging

from .._precision import KVFormat, Precision, WeightFormat
from .._setting import parse_gib
from .._sources import DEFAULT_REPO
from ._offline import add_precision_arguments, precision_of

logger = logging.getLogger(__name__)

DTYPES = ("bfloat16", "float16", "float32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``fit`` subcommand's arguments."""
    from ..server import ServerSettings

    reserve = ServerSettings.__dataclass_fields__["gpu_memory_reserve_gib"].default
    parser.add_argument(
        "--model",
        default=DEFAULT_REPO,
        help=f"a named config (personaplex-7b-v1, tiny), a Hugging Face repo id or a local folder; "
        f"only its config is read (default {DEFAULT_REPO})",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="bfloat16",
        help="the LM's dtype (default bfloat16, as served on CUDA; Mimi is float32)",
    )
    parser.add_argument(
        "--gpu-memory",
        type=_size,
        help="the GPU's memory, such as 24GiB, 80GB or 141GiB (default: the free memory of the current CUDA device)",
    )
    parser.add_argument(
        "--gpu-memory-reserve",
        type=_size,
        default=reserve,
        help=f"memory to leave free, as serve's --gpu-memory-reserve (default {reserve:g} GiB)",
    )
    add_precision_arguments(parser)
    parser.add_argument(
        "--every-choice",
        action="store_true",
        help="also plan every --quantize / --kv-cache pair (some seconds each for a 7B model)",
    )
    parser.add_argument(
        "--transcribe",
        default=None,
        metavar="MODEL",
        help="also plan this transcriber beside the model (tiny, a Kyutai speech-to-text repo id or folder; only "
        "its config is read): the conversations that fit with it and without",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def run(args: argparse.Namespace) -> int:
    """``pplex-trio fit``: print the memory plan of the model on the GPU (a table, or JSON); exit status 2 when the
    config or the GPU's memory cannot be read.
    """
    import torch

    from ..engine import GIB, plan_memory, plan_transcriber_memory
    from ..model import ModelAccessError, load_config, load_stt_config

    try:
        cfg = load_config(args.model)
        stt = (
            None
            if args.transcribe is None
            else load_stt_config("tiny-stt" if args.transcribe == "tiny" else args.transcribe)
        )
    except (ModelAccessError, ValueError) as exc:
        logger.error("%s", exc)
        return 2
    memory = args.gpu_memory
    if memory is None:
        if not torch.cuda.is_available():
            logger.error("no CUDA device here to read free memory from: pass --gpu-memory, such as 24GiB")
            return 2
        memory = torch.cuda.mem_get_info()[0] / GIB
    dtype, gpu, reserve = getattr(torch, args.dtype), int(memory * GIB), int(args.gpu_memory_reserve * GIB)
    chosen = precision_of(args)
    plan = plan_memory(cfg, dtype, precision=chosen)
    figures = plan.as_dict(gpu, reserve)
    if stt is not None:
        beside = plan_transcriber_memory(stt, dtype)
        per_conversation = plan.per_conversation + beside.per_conversation
        fit = max(0, (gpu - reserve - plan.weights - beside.weights - plan.fixed) // per_conversation)
        figures["transcriber"] = beside.as_dict() | {"conversations": fit}
    if args.every_choice:
        figures["choices"] = [
            plan_memory(cfg, dtype, precision=p).as_dict(gpu, reserve) | {"chosen": p == chosen}
            for p in (Precision(w, k) for w in WeightFormat for k in KVFormat)
        ]
    if args.json:
        print(json.dumps(figures, indent=1))
        return 0
    print(_table(figures))
    return 0


def _size(text: str) -> float:
    try:
        return parse_gib(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _table(f: dict) -> str:
    lines = [
        f"model {f['model']}, LM in {f['dtype']} (--quantize {f['quantize']}, --kv-cache {f['kv_cache']}), on "
        f"{f['gpu_memory_gib']:.1f} GiB of GPU memory",
        f"  weights                 {f['weights_gib']:8.2f} GiB",
        f"  fixed engine state      {f['fixed_gib']:8.3f} GiB",
        f"  reserve                 {f['reserve_gib']:8.2f} GiB  (CUDA's context and workspaces, allocator slack)",
        f"  per conversation        {f['per_conversation_gib']:8.3f} GiB, of which:",
    ]
    for name, gib in sorted(f["per_conversation_parts_gib"].items(), key=lambda item: -item[1]):
        lines.append(f"    {name:21} {gib * 1024:9.2f} MiB")
    count = f["conversations"]
    lines.append(f"conversations that fit: {count}")
    if (t := f.get("transcriber")) is not None:
        lines.append(
            f"  with the transcriber {t['model']} ({t['weights_gib']:.2f} GiB of weights, "
            f"{t['per_conversation_gib'] * 1024:.1f} MiB per conversation): {t['conversations']}"
        )
    if count == 0:
        need = f["weights_gib"] + f["fixed_gib"] + f["reserve_gib"] + f["per_conversation_gib"]
        lines.append(f"  (one conversation needs {need:.1f} GiB in all)")
    if "choices" not in f:
        return "\n".join(lines)
    lines.append("every choice on this GPU:  --quantize  --kv-cache  weights GiB  per conversation GiB  fit")
    for c in f["choices"]:
        lines.append(
            f"  {'*' if c['chosen'] else ' '}{' ' * 24}{c['quantize']:10}  {c['kv_cache']:10}  "
            f"{c['weights_gib']:11.2f}  {c['per_conversation_gib']:20.3f}  {c['conversations']:3}"
        )
    return "\n".join(lines)
