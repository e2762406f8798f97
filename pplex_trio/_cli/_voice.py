"""``pplex-trio voice``: make a voice prompt from a clip, and manage a running server's voices.

``voice create CLIP --model M -o NAME.pt`` runs the reference's voice
generation here and writes the ``.pt`` that NVIDIA's server and ours load;
``voice add`` / ``voice rm`` / ``voice list`` talk to a server's
``/api/voices`` (with the ``client`` command's token and TLS options).
"""

from __future__ import annotations

import argparse
import logging
import pathlib

from .._sources import DEFAULT_REPO
from ._reach import add_reach_arguments, reach

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``voice`` subcommand's actions (create, add, rm, list) and their arguments."""
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a voice prompt (.pt) from a clip, here")
    create.add_argument(
        "clip", type=pathlib.Path, help="a few seconds of one person speaking (.wav, .flac, .mp3, .ogg; 8 to 48 kHz)"
    )
    create.add_argument(
        "--model",
        default=DEFAULT_REPO,
        help=f"'tiny', a Hugging Face repo id or a local folder "
        f"(default {DEFAULT_REPO}): a voice prompt belongs to the model that made it",
    )
    create.add_argument("-o", "--output", required=True, type=pathlib.Path, help="the .pt file to write")
    create.add_argument("--device", default=None, help="cuda, cpu … (default: cuda if available)")

    add = actions.add_parser("add", help="add a voice made from a clip to a running server")
    add.add_argument("clip", type=pathlib.Path, help="the clip (.wav, .flac, .mp3, .ogg)")
    add.add_argument("--name", required=True, help="the voice's name: 1 to 48 letters, digits, '-' or '_'")
    add.add_argument("url", help="server URL, e.g. http://127.0.0.1:8998")
    remove = actions.add_parser("rm", help="delete a voice added to a running server")
    remove.add_argument("name", help="the voice (NAME or NAME.pt)")
    remove.add_argument("url", help="server URL")
    listing = actions.add_parser("list", help="the voices of a running server")
    listing.add_argument("url", help="server URL")
    for sub in (add, remove, listing):
        add_reach_arguments(sub)


def run(args: argparse.Namespace) -> int:
    """Run the command; returns the process exit code."""
    if args.action == "create":
        return _create(args)
    from ..client import VoiceApiError, add_voice, list_voices, remove_voice

    reached = reach(args)
    if reached is None:
        return 2
    token, context = reached
    try:
        if args.action == "add":
            added = add_voice(args.url, args.clip, args.name, token=token, ssl_context=context)
            print(f"added {added['voice']} ({added['seconds']:g} s clip)")  # the command's output
        elif args.action == "rm":
            print(f"deleted {remove_voice(args.url, args.name, token=token, ssl_context=context)['deleted']}")
        else:
            listed = list_voices(args.url, token=token, ssl_context=context)
            added_names = set(listed.get("added", []))
            for name in listed["voices"]:
                print(f"{name}\t{'added' if name in added_names else 'model'}")
    except VoiceApiError as exc:
        logger.error("server: %s", exc)
        return 1
    except (OSError, ValueError) as exc:
        logger.error("%s", getattr(exc, "reason", None) or exc)
        return 1
    return 0


def _create(args: argparse.Namespace) -> int:
    from .._conversation import SAMPLE_RATE
    from ..codec import voice_audio
    from ..model import ModelAccessError, load_model, make_voice_prompt
    from ._engines import resolve_device

    if not args.clip.is_file():
        logger.error("%s: no such file", args.clip)
        return 1
    try:
        pcm = voice_audio(args.clip, SAMPLE_RATE)  # a clip that cannot be a voice is told before the model loads
        model = load_model(args.model, device=resolve_device(args.device or "auto"))
        p = model.config.prompt
        prompt, _ = make_voice_prompt(model.lm, model.mimi, pcm, p.sine_tokens, p.zero_text_code, name=args.clip.name)
    except (ModelAccessError, ValueError) as exc:
        logger.error("%s", exc)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    prompt.save(args.output)
    logger.info("wrote %s: %d voice steps for %s", args.output, prompt.num_steps, model.name)
    return 0
