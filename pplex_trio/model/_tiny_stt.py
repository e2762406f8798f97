"""The ``tiny-stt`` model: a random-weight Kyutai speech-to-text checkpoint, generated once and cached.

Like ``tiny`` (:mod:`~pplex_trio.model._tiny`), it needs no download: the
first use writes a folder in Kyutai's own layout under the cache folder,
keyed by a hash of everything that goes into it, which moshi's
``CheckpointInfo`` loads unchanged:

* ``config.json``: flat ``LMModel`` kwargs (``n_q`` 32, ``dep_q`` 0, four
  extra heads), ``stt_config``, ``lm_gen_config``, ``model_type`` ``"stt"``,
  the file names and ``mimi_config_name``;
* ``mimi_config.json``: a small Mimi storing 32 codebooks (the tiny
  PersonaPlex's stores 8), with a short transformer context so that its
  ring wraps within seconds;
* ``model.safetensors`` (Kyutai's key names), the Mimi's safetensors, and a
  SentencePiece tokenizer trained on a small built-in text.

The LM's context is short too (24 frames), so the KV ring wraps within two
seconds of audio.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from .._cache import cache_dir
from ._config import (
    LM_FILE,
    MIMI_FILE,
    TOKENIZER_FILE,
    MimiConfig,
    QuantizerConfig,
    SEANetConfig,
    TransformerConfig,
)
from ._mimi import Mimi
from ._stt_config import STTConfig, mimi_config_to_dict, stt_config_to_dict
from ._tiny import TINY_SEED, _init_lm, _init_mimi, _normal_, train_tokenizer
from ._transcriber import SpeechToText

logger = logging.getLogger(__name__)

TINY_STT_VERSION = 1  # bump when the build changes, so cached folders are rebuilt
MIMI_CONFIG_FILE = "mimi_config.json"
_CARD = 64


def tiny_stt_config() -> STTConfig:
    """The tiny speech-to-text model: the published layout and rules, small dims, short contexts."""
    mimi = MimiConfig(
        seanet=SEANetConfig(dimension=32, n_filters=4),
        quantizer=QuantizerConfig(dimension=16, n_q=32, bins=_CARD, input_dimension=32, output_dimension=32),
        transformer=TransformerConfig(
            d_model=32,
            num_heads=2,
            num_layers=2,
            dim_feedforward=64,
            context=40,
            norm="layer_norm",
            gating="none",
            layer_scale=0.01,
        ),
        num_codebooks=32,
        reference="kyutai",
    )
    return STTConfig(
        name="tiny-stt",
        dim=64,
        num_heads=4,
        num_layers=2,
        context=24,
        text_card=400,
        card=_CARD,
        n_q=32,
        delays=(0,) * 33,
        extra_heads_num_heads=4,
        extra_heads_dim=6,
        audio_delay_seconds=0.5,
        audio_silence_prefix_seconds=1.0,
        mimi=mimi,
        lm_gen={"temp": 0.0, "temp_text": 0.0, "top_k": 250, "top_k_text": 50},
    )


def _config_json(cfg: STTConfig) -> dict:
    return {
        **stt_config_to_dict(cfg, MIMI_CONFIG_FILE),
        "moshi_name": LM_FILE,
        "mimi_name": MIMI_FILE,
        "tokenizer_name": TOKENIZER_FILE,
    }


def _folder_key(cfg: STTConfig) -> str:
    payload = json.dumps(
        {
            "version": TINY_STT_VERSION,
            "seed": TINY_SEED,
            "config": _config_json(cfg),
            "mimi": mimi_config_to_dict(cfg.mimi),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def ensure_tiny_stt_checkpoint(root: Path | None = None) -> Path:
    """The folder of the ``tiny-stt`` checkpoint, building it first if needed."""
    cfg = tiny_stt_config()
    root = Path(root) if root is not None else cache_dir()
    folder = root / f"tiny-stt-{_folder_key(cfg)}"
    if (folder / "config.json").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tiny-stt-"))
    try:
        logger.info("building the tiny speech-to-text model in %s (once)", folder)
        build_tiny_stt_checkpoint(tmp, cfg)
        try:
            tmp.rename(folder)
        except OSError:  # built concurrently by another process
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def build_tiny_stt_checkpoint(folder: Path, cfg: STTConfig) -> None:
    """Write a complete seeded random-weight speech-to-text checkpoint of ``cfg`` into ``folder``, ``config.json``
    last (its presence marks the folder complete)."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(TINY_SEED + 7)
    (folder / TOKENIZER_FILE).write_bytes(train_tokenizer(cfg.text_card))
    model = SpeechToText(cfg)
    _init_lm(model, gen)
    for name, weight in model.named_parameters():  # heads of a few classes: sharper, so probabilities move
        if name.startswith("extra_heads."):
            _normal_(weight, 0.5, gen)
    mimi = Mimi(cfg.mimi)
    _init_mimi(mimi, gen)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / LM_FILE))
    save_file({k: v.contiguous() for k, v in mimi.state_dict().items()}, str(folder / MIMI_FILE))
    (folder / MIMI_CONFIG_FILE).write_text(json.dumps(mimi_config_to_dict(cfg.mimi), indent=2))
    (folder / "config.json").write_text(json.dumps(_config_json(cfg), indent=2))
