"""Run Kyutai's ``moshi.server`` (moshi 0.2.13) on the CPU; executed by the *reference* venv's python.

``bench/reference.py`` starts this file with ``bench/.venv-reference/bin/python``
and the ordinary ``moshi.server`` flags.  It changes only what stops the
reference from *running* here, never how it serves (one conversation at a
time under its ``asyncio.Lock``, each input frame processed as soon as it is
complete):

* ``ServerContext.warmup()`` ends with ``torch.cuda.synchronize()``, which
  raises without CUDA: it becomes a no-op when torch sees no GPU.
* ``moshi.server`` has no flag for float32 and loads the LM in bfloat16.  Our
  server runs float32 on the CPU, so ``--lm-dtype float32`` (the default here)
  makes both compute in the same precision; ``--lm-dtype bfloat16`` keeps
  moshi's own default.
* ``--torch-threads N`` (default 1, what our server picks for a small model
  on the CPU) sets torch's intra-op threads before the model loads.
* ``NO_TORCH_COMPILE=1``: moshi would otherwise ``torch.compile`` a few
  helpers on first use (tens of seconds of compilation, and ours is eager).
* ``HF_HUB_OFFLINE=1``: every file is given as a local path (``--config-path``,
  ``--moshi-weight``, ``--mimi-weight``, ``--tokenizer``, ``--static none``),
  so nothing is fetched; offline mode turns a mistake into an error instead
  of a download.
* Its log goes to stderr (aiohttp prints "Running on ..." to stdout), so the
  benchmark reads one stream.

This file imports nothing from pplex_trio: the reference venv does not have
our dependencies, and must not.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

logger = logging.getLogger("bench.reference.launch")


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--lm-dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--torch-threads", type=int, default=1)
    ours, server_args = parser.parse_known_args()
    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.stdout = sys.stderr
    logging.basicConfig(level=logging.INFO, format="launcher: %(message)s", stream=sys.stderr)

    import torch

    torch.set_num_threads(ours.torch_threads)
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *args, **kwargs: None
        logger.info("no CUDA: torch.cuda.synchronize is a no-op (called once, at the end of warmup)")
    if ours.lm_dtype == "float32":
        from moshi.models import loaders

        get_moshi = loaders.CheckpointInfo.get_moshi

        def get_moshi_float32(self, *args, **kwargs):
            kwargs["dtype"] = torch.float32
            return get_moshi(self, *args, **kwargs)

        loaders.CheckpointInfo.get_moshi = get_moshi_float32
        logger.info("LM loaded in float32 (moshi.server's default is bfloat16)")
    logger.info("torch %s, %d CPU thread(s)", torch.__version__, torch.get_num_threads())
    sys.argv = ["moshi.server", *server_args]
    importlib.import_module("moshi.server")  # the module runs main() when imported


if __name__ == "__main__":
    main()
