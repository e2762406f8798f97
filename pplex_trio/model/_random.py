"""A model of any config with random weights, made straight on its device: the shapes without the weights.

For benchmarks and capacity checks of a model whose weights are not here
(the real PersonaPlex-7B is gated, and our machines cannot download it):
every tensor has the real shape and dtype and finite values, the prompt
runs as it would (a small SentencePiece tokenizer; voice prompts of
``voice_seconds`` each with the official client's names), so the engine
does exactly the work it does with the real weights.  What it says is
noise.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .._voice_catalogue import OFFICIAL_VOICES
from ._config import ModelConfig
from ._lm import LMModel
from ._loading import LoadedModel, lm_dtype_for
from ._mimi import Mimi
from ._text import TextTokenizer
from ._tiny import train_tokenizer
from ._voices import VoiceLibrary, VoicePrompt

TOKENIZER_PIECES = 400


@torch.no_grad()
def random_model(
    cfg: ModelConfig,
    device: str | torch.device = "cpu",
    lm_dtype: torch.dtype | None = None,
    *,
    voice_dir: Path | None = None,
    voices: int = 4,
    voice_seconds: float = 4.0,
    seed: int = 0,
) -> LoadedModel:
    """``cfg`` with N(0, 1/fan_in) weights, unit norms and random codebooks, allocated on ``device``.

    With ``voice_dir``, ``voices`` random voice prompts are written there
    (``NATF0.pt`` ...), ``voice_seconds`` long (12.5 steps a second).
    """
    device = torch.device(device)
    with torch.device("meta"):
        lm, mimi = LMModel(cfg.lm), Mimi(cfg.mimi)
    lm = lm.to(dtype=lm_dtype or lm_dtype_for(device)).to_empty(device=device)
    mimi = mimi.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for module in (lm, mimi):
        stored = module.state_dict(keep_vars=True)  # not the derived buffers (codebook vectors): refresh() makes them
        for name, tensor in [*module.named_parameters(), *((n, b) for n, b in module.named_buffers() if n in stored)]:
            leaf = name.rsplit(".", 1)[-1]
            if (
                leaf == "alpha"
                or (leaf in ("scale", "weight") and tensor.dim() <= 1)
                or leaf in ("_initialized", "cluster_usage")
            ):
                tensor.fill_(1.0)
            elif leaf == "bias":
                tensor.zero_()
            else:
                fan_in = math.prod(tensor.shape[1:]) if tensor.dim() > 1 else 1
                tensor.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
    mimi.refresh()
    pieces = min(cfg.lm.text_card, TOKENIZER_PIECES)
    tokenizer = TextTokenizer(train_tokenizer(pieces), text_card=pieces)
    if voice_dir is not None:
        _write_voices(Path(voice_dir), lm, voices, round(voice_seconds * cfg.mimi.frame_rate), seed)
    return LoadedModel(
        config=cfg, lm=lm.eval(), mimi=mimi.eval(), tokenizer=tokenizer, voices=VoiceLibrary(voice_dir), device=device
    )


def _write_voices(folder: Path, lm: LMModel, count: int, steps: int, seed: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed + 1)
    k, slots = lm.cfg.num_streams, lm.cfg.max_delay + 3
    cache = lm.initial_tokens().cpu()[None, :, None].expand(1, k, slots).clone()
    for name in OFFICIAL_VOICES[:count]:
        embeddings = torch.randn(steps, lm.cfg.dim, generator=gen) * math.sqrt(lm.cfg.num_streams)
        VoicePrompt(name, embeddings, cache).save(folder / name)
