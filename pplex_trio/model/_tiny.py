"""The ``tiny`` model: a complete random-weight checkpoint, generated once and cached.

``--model tiny`` needs no download: the first use builds a checkpoint
folder (``config.json``, weights, a SentencePiece tokenizer trained on a
small built-in text, and ``voices/*.pt``) under the cache folder, keyed
by a hash of everything that goes into it, and then loads it through the
normal local-folder loader.  Same seed, same files.

Random weights need some care to give non-degenerate codes and audio (the
golden set did the same): Mimi's codebooks are fitted to the statistics of
its own latents of a synthetic voice-like signal (random codebooks start at
zero, so every code would be 0), norms and layer scales are drawn away from
their identity init, and the decoder output is scaled to peak near 0.5.
The voices are made by the reference procedure
(:func:`~pplex_trio.model._voices.make_voice_prompt`) from synthetic
recordings of different pitch.  They carry the official client's names
(:data:`~pplex_trio._voice_catalogue.OFFICIAL_VOICES`), so that client's
voice menu works against ``--model tiny`` as it does against PersonaPlex.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import sentencepiece
import torch
from safetensors.torch import save_file
from torch import nn

from .._cache import cache_dir
from .._voice_catalogue import OFFICIAL_VOICES
from ._config import CONFIGS, LM_FILE, MIMI_FILE, TOKENIZER_FILE, ModelConfig
from ._conv import StreamingConv1d
from ._kyutai_config import config_to_kyutai_dict
from ._lm import LMModel
from ._mimi import Mimi
from ._quantizer import Codebook, ResidualVQ
from ._transformer import Attention, LayerScale, RMSNorm
from ._voices import make_voice_prompt

logger = logging.getLogger(__name__)

TINY_VERSION = 2  # bump when the build changes, so cached folders are rebuilt
TINY_SEED = 1234


def _spread(names: list[str], low: float, high: float) -> dict[str, float]:
    """Pitches evenly spaced over ``low..high`` Hz, so every voice sounds different."""
    step = (high - low) / max(len(names) - 1, 1)
    return {name: low + i * step for i, name in enumerate(names)}


_PITCHES = {
    **_spread([n for n in OFFICIAL_VOICES if n[3] == "F"], 180.0, 260.0),
    **_spread([n for n in OFFICIAL_VOICES if n[3] == "M"], 90.0, 150.0),
}
TINY_VOICES = {name: _PITCHES[name] for name in OFFICIAL_VOICES}  # name -> pitch (Hz), the client's order

_CORPUS = """\
You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way.
You enjoy having a good conversation. Have a deep conversation about technology. Your name is Jane.
You work for a small bakery in the old town. Take orders, answer questions about bread and cakes.
Hello, how are you today? I am fine, thank you. What would you like to talk about?
The weather is lovely this morning, with a light breeze coming from the sea.
Could you tell me more about your favourite book, and why you like it so much?
We open at eight in the morning and close at six in the evening, every day except Sunday.
Speech models listen and speak at the same time, one frame every eighty milliseconds.
Numbers like one, two, three, twenty, a hundred and a thousand appear in every conversation.
Please remember to be polite, patient and helpful, and keep your answers short and precise.
"""


def _folder_key(cfg: ModelConfig) -> str:
    payload = json.dumps(
        {
            "version": TINY_VERSION,
            "seed": TINY_SEED,
            "config": config_to_kyutai_dict(cfg),
            "corpus": _CORPUS,
            "voices": TINY_VOICES,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def ensure_tiny_checkpoint(root: Path | None = None) -> Path:
    """The folder of the ``tiny`` checkpoint, building it first if needed."""
    cfg = CONFIGS["tiny"]
    root = Path(root) if root is not None else cache_dir()
    folder = root / f"tiny-{_folder_key(cfg)}"
    if (folder / "config.json").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tiny-"))
    try:
        logger.info("building the tiny model in %s (once)", folder)
        build_tiny_checkpoint(tmp, cfg)
        try:
            tmp.rename(folder)
        except OSError:  # built concurrently by another process
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def synthetic_voice(seconds: float, pitch: float, seed: int, sample_rate: int = 24_000) -> np.ndarray:
    """A deterministic voice-like signal: gliding harmonics, syllable envelope, a little noise."""
    rng = np.random.RandomState(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    f0 = pitch * (1 + 0.1 * np.sin(2 * math.pi * 0.7 * t + rng.uniform(0, 6)))
    phase = 2 * math.pi * np.cumsum(f0) / sample_rate
    signal = sum(np.sin(h * phase + rng.uniform(0, 6)) / h for h in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * math.pi * 4.0 * t + rng.uniform(0, 6)) ** 2
    signal = signal * envelope + 0.05 * rng.randn(t.shape[0])
    return (0.3 * signal / np.abs(signal).max()).astype(np.float32)


def build_tiny_checkpoint(folder: Path, cfg: ModelConfig) -> None:
    """Write a complete seeded random-weight checkpoint of ``cfg`` into ``folder``: tokenizer, weights, voices, and
    ``config.json`` last (its presence marks the folder complete).
    """
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(TINY_SEED)
    (folder / TOKENIZER_FILE).write_bytes(train_tokenizer(cfg.lm.text_card))
    lm = LMModel(cfg.lm)
    _init_lm(lm, gen)
    mimi = Mimi(cfg.mimi)
    _init_mimi(mimi, gen)
    save_file({k: v.contiguous() for k, v in lm.state_dict().items()}, str(folder / LM_FILE))
    save_file({k: v.contiguous() for k, v in mimi.state_dict().items()}, str(folder / MIMI_FILE))
    voices = folder / "voices"
    voices.mkdir()
    for i, (name, pitch) in enumerate(TINY_VOICES.items()):
        pcm = synthetic_voice(2.0, pitch, seed=TINY_SEED + 1 + i)
        prompt, _ = make_voice_prompt(lm, mimi, pcm, cfg.prompt.sine_tokens, cfg.prompt.zero_text_code, name)
        prompt.save(voices / name)
    # Written last: its presence marks a complete folder.
    (folder / "config.json").write_text(json.dumps(config_to_kyutai_dict(cfg), indent=2))


def train_tokenizer(vocab_size: int) -> bytes:
    """A SentencePiece unigram model of ``vocab_size`` pieces trained on a small built-in corpus, as serialized
    bytes."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS.splitlines() * 4),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        byte_fallback=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        num_threads=1,
        minloglevel=2,
        user_defined_symbols=["<system>"],
    )
    return model.getvalue()


def _normal_(t: torch.Tensor, std: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        t.copy_(torch.randn(t.shape, generator=gen) * std)


def _uniform_(t: torch.Tensor, low: float, high: float, gen: torch.Generator) -> None:
    with torch.no_grad():
        t.copy_(low + (high - low) * torch.rand(t.shape, generator=gen))


def _init_lm(lm: nn.Module, gen: torch.Generator) -> None:
    for name, p in lm.named_parameters():
        if name.endswith(".alpha"):
            _uniform_(p, 0.5, 1.5, gen)
        elif "emb" in name:
            _normal_(p, 1.0, gen)
        else:
            _normal_(p, 1.0 / math.sqrt(p.shape[-1]), gen)


@torch.no_grad()
def _init_mimi(mimi: Mimi, gen: torch.Generator) -> None:
    for module in mimi.modules():
        if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
            w = module.weight
            fan_in = (w.shape[1] if isinstance(module, nn.Conv1d) else w.shape[0] // module.groups) * w.shape[2]
            _normal_(w, 1.0 / math.sqrt(fan_in), gen)
            if module.bias is not None:
                _normal_(module.bias, 0.01, gen)
        elif isinstance(module, nn.Linear):
            _normal_(module.weight, 1.0 / math.sqrt(module.weight.shape[1]), gen)
        elif isinstance(module, nn.LayerNorm):
            _uniform_(module.weight, 0.5, 1.5, gen)
            _normal_(module.bias, 0.1, gen)
        elif isinstance(module, LayerScale):
            _uniform_(module.scale, 0.1, 0.5, gen)
        elif isinstance(module, RMSNorm):
            _uniform_(module.alpha, 0.5, 1.5, gen)
        elif isinstance(module, Attention):
            _normal_(module.in_proj_weight, 1.0 / math.sqrt(module.in_proj_weight.shape[1]), gen)
    # Codebooks: fitted to the latents of a synthetic signal, level by level on the residual.
    pcm = torch.from_numpy(synthetic_voice(8.0, 140.0, seed=TINY_SEED))
    frame = mimi.frame_size
    state = mimi.init_encoder_state(1)
    latents = torch.cat(
        [mimi.encode_latent(pcm[i : i + frame][None], state) for i in range(0, pcm.shape[0], frame)], -1
    )
    for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
        _fit_codebooks(rvq, latents, gen)
    mimi.refresh()
    # Scale the decoder's last conv so the reconstruction peaks near 0.5.
    codes = mimi.quantizer.encode(latents, mimi.num_codebooks)
    dec = mimi.init_decoder_state(1)
    audio = torch.cat([mimi.decode_frame(codes[:, :, i], dec) for i in range(codes.shape[-1])], -1)
    last_layer = mimi.decoder.model[-1]
    assert isinstance(last_layer, StreamingConv1d)
    last = last_layer.conv.conv
    assert last.bias is not None
    scale = 0.5 / max(audio.abs().max().item(), 1e-6)
    last.weight.mul_(scale)
    last.bias.mul_(scale)


def _fit_codebooks(rvq: ResidualVQ, latents: torch.Tensor, gen: torch.Generator) -> None:
    residual = rvq.input_proj(latents).transpose(1, 2).reshape(-1, rvq.input_proj.weight.shape[0])
    for layer in rvq.vq.layers:
        cb: Codebook = layer._codebook
        bins, dim = cb.embedding_sum.shape
        centroids = residual.mean(0) + residual.std(0) * torch.randn(bins, dim, generator=gen)
        usage = 0.5 + 1.5 * torch.rand(bins, generator=gen)
        cb.cluster_usage.copy_(usage)
        cb.embedding_sum.copy_(centroids * usage[:, None])
        cb._initialized.fill_(1.0)
        cb.refresh()
        residual = residual - cb.centroids[cb.nearest(residual)]
