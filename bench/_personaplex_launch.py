"""Run NVIDIA PersonaPlex's own server on a tiny PersonaPlex-layout checkpoint, on the CPU.

``bench/ready.py`` starts this file with the python of a venv holding the
fork's own pins (``bench/.venv-personaplex``: sphn 0.1, numpy < 2.2, aiohttp
..., torch held at ours) and ``PYTHONPATH=<checkout>/moshi``, so ``import moshi`` is
NVIDIA's fork from a checkout of github.com/NVIDIA/personaplex that the user
points the benchmark at; nothing of it is copied into this repository.

Its server hard-codes the 7B sizes and the Hugging Face downloads; these
runtime patches (no source file is edited; the same ones the golden data of
``../shared/golden`` was made with, see its ``expected/notes.md``) make it
serve the checkpoint folder given as ``--checkpoint``:

* ``loaders._seanet_kwargs`` / ``_quantizer_kwargs`` / ``_transformer_kwargs``
  and ``_lm_kwargs`` take the checkpoint's ``config.json`` values for the
  keys the fork passes (its own defaults for the others);
* ``loaders.get_moshi_lm`` loads float32 (its default is bfloat16; ours runs
  float32 on the CPU, so both compute in the same precision);
* ``moshi.models.lm.SILENCE_TOKENS`` / ``SINE_TOKENS`` become the
  checkpoint's ``personaplex`` constants (the real codes index past a tiny
  codebook);
* its sampling's top-k (250 audio, 25 text) is cut to the checkpoint's
  vocabularies, which are smaller (a top-k over more entries than there are
  means all of them; ``torch.topk`` refuses it);
* ``huggingface_hub.hf_hub_download`` returns the checkpoint's own files
  (the server fetches ``config.json`` "to increment the download counter");
* ``torch.cuda.synchronize`` is a no-op without CUDA (its warm-up calls it);
  ``--torch-threads`` (default 1, what ours picks for a small model).

How it serves is untouched: one conversation at a time under its lock, the
system prompt stepped through before the handshake.  This file imports
nothing from pplex_trio.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import os
import pathlib
import sys

logger = logging.getLogger("bench.personaplex.launch")


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.INFO, format="launcher: %(message)s", stream=sys.stderr)
    folder = args.checkpoint.resolve()
    config = json.loads((folder / "config.json").read_text())

    import huggingface_hub
    import numpy as np
    import torch

    torch.set_num_threads(args.torch_threads)
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
    huggingface_hub.hf_hub_download = lambda repo_id, filename, *a, **k: str(folder / filename)

    from moshi.models import lm, loaders

    for name, part in (
        ("_seanet_kwargs", "seanet"),
        ("_quantizer_kwargs", "quantizer"),
        ("_transformer_kwargs", "transformer"),
    ):  # the fork's own keys, the checkpoint's values
        setattr(
            loaders, name, {key: config["mimi"][part].get(key, value) for key, value in getattr(loaders, name).items()}
        )
    loaders._lm_kwargs = {key: config.get(key, value) for key, value in loaders._lm_kwargs.items()}
    loaders.get_moshi_lm = functools.partial(loaders.get_moshi_lm, dtype=torch.float32)
    lm.SILENCE_TOKENS = np.array(config["personaplex"]["silence_tokens"], dtype=np.int64)
    make_gen = lm.LMGen.__init__

    def small_top_k(self, *a, **k):  # top-k over a vocabulary smaller than k is the whole vocabulary
        k.setdefault("top_k", min(250, config["card"]))
        k.setdefault("top_k_text", min(25, config["text_card"]))
        make_gen(self, *a, **k)

    lm.LMGen.__init__ = small_top_k
    lm.SINE_TOKENS = np.array(config["personaplex"]["sine_tokens"], dtype=np.int64)
    logger.info(
        "NVIDIA PersonaPlex server from %s on %s (float32, %d CPU thread(s))",
        pathlib.Path(lm.__file__).resolve().parent.parent,
        folder,
        torch.get_num_threads(),
    )
    sys.argv = [
        "moshi.server",
        "--moshi-weight",
        str(folder / config.get("moshi_name", "model.safetensors")),
        "--mimi-weight",
        str(folder / config["mimi_name"]),
        "--tokenizer",
        str(folder / config["tokenizer_name"]),
        "--voice-prompt-dir",
        str(folder / "voices"),
        "--device",
        "cpu",
        "--static",
        "none",
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
    ]
    importlib.import_module("moshi.server")  # the module runs main() when imported


if __name__ == "__main__":
    main()
