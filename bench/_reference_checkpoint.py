"""The tiny checkpoint both servers of ``bench/reference.py`` serve, and moshi's view of it.

Why card 2048: the oracle suite's tiny Kyutai checkpoint has 64-entry audio
codebooks, and our engine substitutes the real 7B silence codes (948, ...)
for not-yet-valid agent codes on the first LIVE tick, which index past a
64-entry codebook (pinned by ``tests/oracle/test_engine_oracle.py``).  With
the real card of 2048 every code is valid, so the comparison does not depend
on that fix.  Everything else is the oracle suite's ``kyutai-dep8`` spec
(Kyutai layout, ``dep_q`` 8, no ``personaplex`` object, so neither server
runs a system prompt), built by moshi 0.2.13's own constructors with random
weights through ``tests/oracle/_tiny_moshi.py``.

Why a second config file: moshi's ``CheckpointInfo`` passes every key of
``config.json`` it does not know to ``LMModel(**kwargs)``, so our extra
``mimi`` and ``notes`` objects would make it fail.  :func:`write_moshi_config`
writes ``moshi-config.json`` beside it with only what moshi reads: the LM
kwargs, the file names, the sampling (``lm_gen_config``) and, through the
``file://`` form of ``mimi_config_name`` that ``loaders.hf_get`` resolves
locally, the tiny Mimi's config.  No hub access is involved.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import sys
from unittest import mock

REPO = pathlib.Path(__file__).resolve().parent.parent

logger = logging.getLogger(__name__)

CARD = 2048
MOSHI_CONFIG = "moshi-config.json"
MOSHI_MIMI_CONFIG = "moshi-mimi.json"

# The official client's sampling (docs/PROTOCOL.md): our server takes it from the
# query string, moshi's server from ``lm_gen_config``.
SAMPLING_QUERY = {"text_temperature": 0.7, "text_topk": 25, "audio_temperature": 0.8, "audio_topk": 250}
LM_GEN_CONFIG = {"use_sampling": True, "temp": 0.8, "temp_text": 0.7, "top_k": 250, "top_k_text": 25}


def _tiny():
    """``tests/oracle/_tiny_moshi.py`` (imported lazily: it needs moshi and torch)."""
    sys.path.insert(0, str(REPO / "tests" / "oracle"))
    import _tiny_moshi

    return _tiny_moshi


def spec():
    tiny = _tiny()
    return dataclasses.replace(tiny.KYUTAI_DEP8, name=f"kyutai-dep8-card{CARD}")


def build(directory: pathlib.Path, speech_path: pathlib.Path) -> pathlib.Path:
    """Write the tiny card-2048 Kyutai checkpoint to ``directory`` plus moshi's config files."""
    tiny = _tiny()
    speech = tiny.load_speech(speech_path, seconds=8.0)
    # _tiny_moshi reads its module-level CARD when it builds the configs.
    with mock.patch.object(tiny, "CARD", CARD):
        tiny.make_checkpoint(directory, spec(), speech)
    write_moshi_config(directory)
    return directory


def moshi_config(config: dict, mimi_config_path: pathlib.Path) -> dict:
    """What moshi's ``CheckpointInfo.from_hf_repo`` should read for our ``config.json``."""
    tiny = _tiny()
    out = tiny.config_lm_kwargs(config)
    out.update(
        model_type="moshi",
        moshi_name=config["moshi_name"],
        mimi_name=config["mimi_name"],
        tokenizer_name=config["tokenizer_name"],
        mimi_config_name="file://" + str(mimi_config_path.resolve()),
        lm_gen_config=dict(LM_GEN_CONFIG),
    )
    return out


def write_moshi_config(directory: pathlib.Path) -> pathlib.Path:
    """Write ``moshi-config.json`` and ``moshi-mimi.json`` into ``directory``; return the former."""
    tiny = _tiny()
    config = tiny.read_config(directory)
    mimi_path = directory / MOSHI_MIMI_CONFIG
    mimi_path.write_text(json.dumps(tiny._moshi_mimi_config(config["mimi"]), indent=2) + "\n")
    path = directory / MOSHI_CONFIG
    path.write_text(json.dumps(moshi_config(config, mimi_path), indent=2) + "\n")
    return path


def reference_args(directory: pathlib.Path) -> list[str]:
    """The ``moshi.server`` flags that point it at ``directory`` and nothing else."""
    config = json.loads((directory / "config.json").read_text())
    return [
        "--config-path",
        str(directory / MOSHI_CONFIG),
        "--moshi-weight",
        str(directory / config["moshi_name"]),
        "--mimi-weight",
        str(directory / config["mimi_name"]),
        "--tokenizer",
        str(directory / config["tokenizer_name"]),
        "--device",
        "cpu",
        "--static",
        "none",
    ]
