"""Tiny Kyutai models with random weights, built by ``moshi`` itself, saved as checkpoints.

The oracle tests compare our implementation with Kyutai's reference package
(``moshi==0.2.13``) on the *same weights*.  Nothing is downloaded: this module
builds tiny models in-process with moshi's own constructors
(``loaders.get_mimi`` / ``loaders.get_moshi_lm``), gives them weights that make
the comparison meaningful (random Mimi codebooks are all zero, so every code
would be 0), and writes each one as a checkpoint directory in the official
layout that our normal loader reads:

==============================================  =====================================
``config.json``                                 Kyutai convention (flat LM kwargs,
                                                ``moshi_name``/``mimi_name``/
                                                ``tokenizer_name``, ``lm_gen_config``)
                                                plus a ``mimi`` object and, for the
                                                PersonaPlex-style model, a
                                                ``personaplex`` object, like
                                                ``shared/golden/tiny-public``.
``model.safetensors``                           the LM, fp32, official key names
                                                (fused ``self_attn.in_proj_weight``)
``tokenizer-e351c8d8-checkpoint125.safetensors``  Mimi, fp32, 16 codebooks stored
``tokenizer_spm_32k_3.model``                   SentencePiece unigram, 128 pieces,
                                                trained here (0 unk, 1 bos, 2 eos,
                                                3 pad)
==============================================  =====================================

The oracle side reloads every checkpoint through moshi's own loaders
(:func:`load_moshi_mimi`, :func:`load_moshi_lm`), so both implementations read
the same bytes and the files are proven to be in a layout moshi accepts.

This module is shared by ``tests/oracle`` and ``bench/engine_step.py``; it
imports ``moshi`` lazily so that importing it never fails.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import logging
import os
import pathlib
import re
import typing as tp

# moshi wraps a few CPU-side functions in torch.compile, which only slows the
# first call by tens of seconds; eager is the reference we want.  It is read
# when moshi is imported, so it must be set first.
os.environ.setdefault("NO_TORCH_COMPILE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

if tp.TYPE_CHECKING:  # pragma: no cover
    from moshi.models.compression import MimiModel
    from moshi.models.lm import LMModel

logger = logging.getLogger(__name__)

FRAME_SIZE = 1920
SAMPLE_RATE = 24_000

MOSHI_NAME = "model.safetensors"
MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_NAME = "tokenizer_spm_32k_3.model"

# Keys of config.json that are not LMModel kwargs (same list as the golden set).
NON_LM_KEYS = frozenset(
    {
        "model_type",
        "moshi_name",
        "mimi_name",
        "tokenizer_name",
        "mimi_config_name",
        "lm_gen_config",
        "mimi",
        "personaplex",
        "notes",
        "golden",
    }
)

# The fork's prompt constants (as in pplex_trio/model/_config.py); tiny checkpoints store them modulo card.
SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)

CARD = 64

# Inputs shared by the oracle suite.  Every LM comparison runs LM_STEPS steps:
# far past the tiny contexts (24 and 32 frames), so the KV rings wrap several
# times.  Batched runs have BATCH rows, row r listening to the speech from
# r * ROW_OFFSET_S seconds on.
LM_STEPS = 200
BATCH = 4
ROW_OFFSET_S = 5.0
TEXT_CARD = 128
MIMI_CODEBOOKS_STORED = 16
MIMI_CODEBOOKS_USED = 8


@dataclasses.dataclass(frozen=True)
class TinySpec:
    """What differs between the tiny checkpoints the tests build.

    ``context`` is deliberately small so that the LM's KV ring wraps within a
    few dozen steps; ``mimi_context`` does the same for Mimi's transformers
    (counted in 25 Hz steps, two per frame).
    """

    name: str
    dep_q: int
    seed: int
    dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    context: int = 24
    depformer_dim: int = 32
    depformer_num_heads: int = 2
    depformer_num_layers: int = 2
    depformer_dim_feedforward: int = 64
    mimi_context: int = 40
    personaplex: bool = False


KYUTAI_DEP8 = TinySpec(name="kyutai-dep8", dep_q=8, seed=20240917, dim=48, num_heads=3, context=24)
PERSONAPLEX_DEP16 = TinySpec(name="personaplex-dep16", dep_q=16, seed=20250101, context=32, personaplex=True)
SPECS = {spec.name: spec for spec in (KYUTAI_DEP8, PERSONAPLEX_DEP16)}


# --------------------------------------------------------------------------- configs


def mimi_config(spec: TinySpec) -> dict:
    """The ``mimi`` object of config.json: ``loaders._mimi_config`` shrunk.

    SEANet ratios stay ``[8, 6, 5, 4]`` so that a frame is 1920 samples.  Keys
    beyond what moshi's ``get_mimi`` reads mirror the golden set's config.
    """
    from moshi.models import loaders

    cfg = copy.deepcopy(loaders._mimi_config)
    seanet = cfg["seanet"]
    seanet.update(dimension=32, n_filters=4)
    assert seanet["ratios"] == [8, 6, 5, 4], "a Mimi frame must stay 1920 samples"
    cfg["quantizer"].update(
        dimension=16,
        n_q=MIMI_CODEBOOKS_STORED,
        bins=CARD,
        input_dimension=32,
        output_dimension=32,
        n_q_semantic=1,
        codebook_epsilon=1e-5,
    )
    cfg["transformer"].update(
        d_model=32,
        num_heads=2,
        num_layers=2,
        context=spec.mimi_context,
        dim_feedforward=64,
        input_dimension=32,
        output_dimensions=[32],
    )
    cfg.update(
        causal=True,
        encoder_frame_rate=25.0,
        resample_method="conv",
        upsample_channel_wise_bug=True,
        num_codebooks=MIMI_CODEBOOKS_USED,
    )
    return cfg


def _moshi_mimi_config(cfg: dict) -> dict:
    """The subset of our ``mimi`` object that moshi 0.2.13's constructors accept."""
    cfg = copy.deepcopy(cfg)
    # 0.2.13's ResidualVectorQuantizer has no epsilon argument (its default is 1e-5).
    eps = cfg["quantizer"].pop("codebook_epsilon", 1e-5)
    assert eps == 1e-5, "moshi 0.2.13 hard-codes the codebook epsilon to 1e-5"
    return cfg


def lm_kwargs(spec: TinySpec) -> dict:
    """Flat ``LMModel`` kwargs: ``loaders._lm_kwargs`` shrunk to ``spec``."""
    from moshi.models import loaders

    kw = copy.deepcopy(loaders._lm_kwargs)
    kw.update(
        dim=spec.dim,
        text_card=TEXT_CARD,
        n_q=16,
        dep_q=spec.dep_q,
        card=CARD,
        num_heads=spec.num_heads,
        num_layers=spec.num_layers,
        context=spec.context,
        depformer_dim=spec.depformer_dim,
        depformer_dim_feedforward=spec.depformer_dim_feedforward,
        depformer_num_heads=spec.depformer_num_heads,
        depformer_num_layers=spec.depformer_num_layers,
    )
    assert kw["delays"] == [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
    return kw


def personaplex_config() -> dict:
    """Prompt constants for the PersonaPlex-style checkpoint (golden convention)."""
    return {
        "silence_tokens": [t % CARD for t in SILENCE_TOKENS],
        "sine_tokens": [t % CARD for t in SINE_TOKENS],
        "silence_tokens_rule": "fork's SILENCE_TOKENS modulo card",
        "sine_tokens_rule": "fork's SINE_TOKENS modulo card",
        "zero_text_code": 3,
        "audio_silence_frame_cnt": 6,
        "text_prompt_wrap": "<system> {prompt} <system>",
        "agent_audio_output_rows": [1, 8],
    }


def checkpoint_config(spec: TinySpec) -> dict:
    """The whole ``config.json`` of a tiny checkpoint."""
    cfg: dict[str, tp.Any] = {
        "model_type": "personaplex" if spec.personaplex else "moshi",
        "moshi_name": MOSHI_NAME,
        "mimi_name": MIMI_NAME,
        "tokenizer_name": TOKENIZER_NAME,
        "lm_gen_config": {
            "use_sampling": False,
            "temp": 0.8,
            "temp_text": 0.7,
            "top_k": 250,
            "top_k_text": 25,
        },
    }
    cfg.update(lm_kwargs(spec))
    cfg["mimi"] = mimi_config(spec)
    if spec.personaplex:
        cfg["personaplex"] = personaplex_config()
    cfg["notes"] = {
        "made_by": "tests/oracle/_tiny_moshi.py with moshi 0.2.13's own constructors, random weights",
        "spec": dataclasses.asdict(spec),
    }
    return cfg


# --------------------------------------------------------------------------- key layout

_SPLIT_ATTN = re.compile(r"^(?P<prefix>.*\.self_attn\.)(?P<kind>in|out)_projs\.(?P<i>\d+)\.weight$")


def to_official_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Module state dict -> the key layout of Kyutai's published checkpoints.

    moshi 0.2.13's modules hold one ``in_projs.{i}`` / ``out_projs.{i}`` linear
    per depformer step; the published files (and the golden set) store them
    stacked along dim 0 as ``self_attn.in_proj_weight`` /
    ``self_attn.out_proj.weight``.  moshi's load hook undoes exactly this.
    """
    out: dict[str, torch.Tensor] = {}
    stacks: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for key, value in state.items():
        m = _SPLIT_ATTN.match(key)
        if m is None:
            out[key] = value.detach().clone().contiguous()
        else:
            stacks.setdefault((m["prefix"], m["kind"]), {})[int(m["i"])] = value
    for (prefix, kind), parts in stacks.items():
        stacked = torch.cat([parts[i] for i in range(len(parts))], dim=0).detach().clone().contiguous()
        out[prefix + ("in_proj_weight" if kind == "in" else "out_proj.weight")] = stacked
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- Mimi


def _randomize_mimi(mimi: MimiModel, gen: torch.Generator) -> None:
    """Give every Mimi weight a scale under which audio neither dies nor explodes.

    Convs: N(0, 1/fan_in) weights, N(0, 0.01^2) biases, where fan_in counts the
    inputs one output sample sums over (for a transposed conv, ``in * k /
    stride``).  Transformer LayerNorms U(0.5, 1.5) / N(0, 0.1^2), LayerScales
    U(0.1, 0.5), so that the transformers matter.
    """
    for module in mimi.modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            w = module.weight
            k = w.shape[-1]
            if isinstance(module, torch.nn.ConvTranspose1d):
                fan_in = w.shape[0] // module.groups * max(1, k // module.stride[0])
            else:
                fan_in = w.shape[1] * k
            w.data.copy_(torch.randn(w.shape, generator=gen) / fan_in**0.5)
            if module.bias is not None:
                module.bias.data.copy_(torch.randn(module.bias.shape, generator=gen) * 0.01)
        elif isinstance(module, torch.nn.LayerNorm):
            module.weight.data.copy_(torch.rand(module.weight.shape, generator=gen) + 0.5)
            module.bias.data.copy_(torch.randn(module.bias.shape, generator=gen) * 0.1)
    for name, param in mimi.named_parameters():
        if name.endswith("layer_scale_1.scale") or name.endswith("layer_scale_2.scale"):
            param.data.copy_(torch.rand(param.shape, generator=gen) * 0.4 + 0.1)


def _fill_codebooks(mimi: MimiModel, latent: torch.Tensor, gen: torch.Generator) -> None:
    """Codebooks from the statistics of a real latent, level by level.

    For each RVQ (semantic ``rvq_first`` and acoustic ``rvq_rest``), each
    level's centroids are ``mean + std * N(0, 1)`` of the running residual of
    that RVQ's projected input, so that every level splits real data.  As in
    the golden set, ``cluster_usage`` is U(0.5, 2) and ``embedding_sum`` is
    ``centroid * cluster_usage``, so the division moshi does matters.
    """
    quantizer = mimi.quantizer
    for rvq in (quantizer.rvq_first, quantizer.rvq_rest):
        residual = rvq.input_proj(latent)  # [B, D, T]
        for layer in rvq.vq.layers:
            codebook = layer._codebook
            flat = residual.transpose(1, 2).reshape(-1, residual.shape[1])
            mean, std = flat.mean(0), flat.std(0)
            centroids = mean + std * torch.randn(codebook.embedding_sum.shape, generator=gen)
            usage = torch.rand(codebook.cluster_usage.shape, generator=gen) * 1.5 + 0.5
            codebook.embedding_sum.data.copy_(centroids * usage[:, None])
            codebook.cluster_usage.data.copy_(usage)
            codebook._initialized.data.fill_(1.0)
            codebook._embedding = None
            codebook._cached_initialized = False
            residual = residual - layer.decode(layer.encode(residual))


def build_mimi(spec: TinySpec, speech: np.ndarray) -> MimiModel:
    """A tiny moshi Mimi with noise weights and data-driven codebooks.

    ``speech`` (float32 mono 24 kHz) drives the codebook statistics and the
    output level: the decoder's last conv is scaled so that a reconstruction of
    it peaks at 0.5.
    """
    from moshi.models import loaders

    torch.manual_seed(spec.seed)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    cfg = _moshi_mimi_config(mimi_config(spec))
    mimi = loaders.get_mimi(None, cfg, device="cpu", num_codebooks=MIMI_CODEBOOKS_USED)
    mimi.set_num_codebooks(MIMI_CODEBOOKS_STORED)  # fill all stored codebooks
    _randomize_mimi(mimi, gen)
    clip = torch.from_numpy(np.ascontiguousarray(speech[: 6 * SAMPLE_RATE], dtype=np.float32))[None, None]
    with torch.no_grad():
        latent = mimi._encode_to_unquantized_latent(clip)
        _fill_codebooks(mimi, latent, gen)
        mimi.set_num_codebooks(MIMI_CODEBOOKS_USED)
        recon = mimi.decode(mimi.encode(clip))
        peak = float(recon.abs().max())
        last = mimi.decoder.model[-1].conv.conv
        last.weight.mul_(0.5 / peak)
        last.bias.mul_(0.5 / peak)
    return mimi


# --------------------------------------------------------------------------- LM


def build_lm(spec: TinySpec) -> LMModel:
    """A tiny moshi LM from moshi's own random-init path, fp32.

    RMSNorm ``alpha`` (initialised to 1) is overwritten with U(0.5, 1.5) so that
    the norm weights matter, as in the golden set.
    """
    from moshi.models import loaders

    torch.manual_seed(spec.seed)
    lm = loaders.get_moshi_lm(None, lm_kwargs=lm_kwargs(spec), device="cpu", dtype=torch.float32)
    gen = torch.Generator().manual_seed(spec.seed + 2)
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if name.endswith(".alpha"):
                param.copy_(torch.rand(param.shape, generator=gen) + 0.5)
    return lm.eval()


# --------------------------------------------------------------------------- tokenizer

_CORPUS = """\
You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way.
You enjoy having a good conversation. Listen carefully, then speak when it is your turn.
The weather is lovely today, so we could take a walk in the park and talk about books.
Tell me about your favourite place to visit, and why you would like to go back there.
A quick brown fox jumps over the lazy dog while the radio plays an old jazz tune.
Customer service: your order has shipped and should arrive within three business days.
Please hold on a moment while I check the details of your appointment for next week.
Numbers such as 1, 2, 3, 42 and 100 appear now and then, as do questions? And answers!
"""


def train_tokenizer(path: pathlib.Path, vocab_size: int = TEXT_CARD) -> None:
    """Write :func:`tokenizer_model` to ``path``."""
    path.write_bytes(tokenizer_model(vocab_size))


def tokenizer_model(vocab_size: int = TEXT_CARD) -> bytes:
    """Train a SentencePiece unigram model in-process, ids as in the golden set.

    ``vocab_size`` equals the LM's ``text_card`` so that every id the LM can
    emit has a piece.  0 = ``<unk>`` (EPAD in the LM), 1 ``<s>``, 2 ``</s>``,
    3 = ``<pad>`` (PAD).
    """
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS.splitlines() * 4),
        model_writer=model,
        model_type="unigram",
        vocab_size=vocab_size,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    directory: pathlib.Path,
    spec: TinySpec,
    mimi: MimiModel,
    lm: LMModel,
) -> pathlib.Path:
    """Write ``mimi`` and ``lm`` as a checkpoint directory in the official layout."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(to_official_keys(lm.state_dict()), str(directory / MOSHI_NAME))
    save_file(to_official_keys(mimi.state_dict()), str(directory / MIMI_NAME))
    train_tokenizer(directory / TOKENIZER_NAME)
    (directory / "config.json").write_text(json.dumps(checkpoint_config(spec), indent=2) + "\n")
    return directory


@contextlib.contextmanager
def one_thread() -> tp.Iterator[None]:
    """Run torch on one CPU thread for the duration (then restore the previous count).

    Tiny models gain nothing from threads, a shared 2-core machine makes them
    stall, and a fixed count makes float rounding reproducible.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def make_checkpoint(directory: pathlib.Path, spec: TinySpec, speech: np.ndarray) -> pathlib.Path:
    """Build and save the tiny checkpoint ``spec``: the same bytes for the same seed and speech.

    Built on one torch thread: the codebooks come from a forward pass, whose
    float rounding depends on the thread count.
    """
    with one_thread():
        mimi = build_mimi(spec, speech)
        lm = build_lm(spec)
    save_checkpoint(directory, spec, mimi, lm)
    logger.info("tiny checkpoint %s written to %s", spec.name, directory)
    return directory


def read_config(directory: pathlib.Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def config_lm_kwargs(config: dict) -> dict:
    """The ``LMModel`` kwargs of a config.json (every key but the known extras)."""
    return {k: v for k, v in config.items() if k not in NON_LM_KEYS}


def load_moshi_mimi(directory: pathlib.Path, num_codebooks: int = MIMI_CODEBOOKS_USED) -> MimiModel:
    """Load a checkpoint's Mimi through moshi's own loader (strict)."""
    from moshi.models import loaders

    cfg = read_config(directory)
    return loaders.get_mimi(
        directory / cfg["mimi_name"],
        _moshi_mimi_config(cfg["mimi"]),
        device="cpu",
        num_codebooks=num_codebooks,
    )


def load_moshi_lm(directory: pathlib.Path, **overrides: tp.Any) -> LMModel:
    """Load a checkpoint's LM through moshi's own loader (strict), fp32."""
    from moshi.models import loaders

    cfg = read_config(directory)
    kw = config_lm_kwargs(cfg) | overrides
    return loaders.get_moshi_lm(directory / cfg["moshi_name"], lm_kwargs=kw, device="cpu", dtype=torch.float32)


def load_speech(path: pathlib.Path, seconds: float | None = None) -> np.ndarray:
    """Mono float32 24 kHz speech read with sphn, optionally truncated."""
    import sphn

    pcm, sr = sphn.read(str(path), sample_rate=SAMPLE_RATE)
    pcm = np.asarray(pcm[0], dtype=np.float32)
    if seconds is not None:
        pcm = pcm[: int(seconds * SAMPLE_RATE)]
    return pcm


def frames(pcm: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` whole 1920-sample frames of ``pcm``: ``[n, 1920]``."""
    assert pcm.shape[0] >= n * FRAME_SIZE, f"need {n} frames, have {pcm.shape[0] / FRAME_SIZE:.1f}"
    return pcm[: n * FRAME_SIZE].reshape(n, FRAME_SIZE)


# --------------------------------------------------------------------------- dep_q 16 -> 8


def truncate_depformer(state: dict[str, torch.Tensor], dep_q: int, new_dep_q: int) -> dict[str, torch.Tensor]:
    """An official-layout LM state with only the first ``new_dep_q`` depformer steps.

    Why: moshi 0.2.13 generates *every* depformer stream (a dep_q=16 LMGen
    takes no user audio), while PersonaPlex teacher-forces steps 8-15 with the
    user's codes and discards their predictions.  Depformer step ``s`` only
    attends to steps ``< s``, so PersonaPlex's text and agent audio depend on
    steps 0-7 alone: a dep_q=8 moshi LM holding those steps' weights is an exact
    oracle for it.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        m = re.match(r"^(depformer_in|depformer_emb|linears)\.(\d+)\.", key)
        g = re.match(r"^depformer\.layers\.\d+\.gating\.(\d+)\.", key)
        if m is not None:
            limit = new_dep_q - 1 if m[1] == "depformer_emb" else new_dep_q
            if int(m[2]) < limit:
                out[key] = value
        elif g is not None:
            if int(g[1]) < new_dep_q:
                out[key] = value
        elif re.match(r"^depformer\.layers\.\d+\.self_attn\.(in_proj_weight|out_proj\.weight)$", key):
            rows = value.shape[0] // dep_q
            out[key] = value[: rows * new_dep_q].clone()
        else:
            out[key] = value
    return out
