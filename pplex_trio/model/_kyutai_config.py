"""Kyutai's ``config.json`` convention, read into and written from a :class:`ModelConfig`.

Checkpoints describe themselves with flat ``LMModel`` keyword arguments
plus ``moshi_name`` / ``mimi_name`` / ``tokenizer_name`` (and, in our golden
set, a ``mimi`` object and a ``personaplex`` object).
:func:`config_from_kyutai_dict` reads that; PersonaPlex's own
``config.json`` is empty, which means "the official PersonaPlex-7B
dimensions".  :func:`config_to_kyutai_dict` writes it (for the tiny
checkpoint).  Kept apart from the dataclasses so that the config types do
not carry the key tables and checks of one file format.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from ._config import (
    LM_FILE,
    MIMI_FILE,
    TOKENIZER_FILE,
    LMConfig,
    MimiConfig,
    ModelConfig,
    PromptConfig,
    QuantizerConfig,
    SEANetConfig,
    TransformerConfig,
    check_reference,
)

logger = logging.getLogger(__name__)

# Keys of config.json that are not LMModel kwargs.
_NON_LM_KEYS = {
    "model_type",
    "moshi_name",
    "mimi_name",
    "tokenizer_name",
    "mimi_config_name",
    "lm_gen_config",
    "mimi",
    "personaplex",
    "reference",
    "notes",
    "golden",
    "model_id",
    "tts_config",
    "stt_config",
    "lora_name",
}
# LMModel kwargs that only matter for training or are implied by our architecture.
_IGNORED_LM_KEYS = {
    "causal",
    "depformer_causal",
    "positional_embedding",
    "depformer_pos_emb",
    "depformer_context",
    "depformer_max_period",
    "depformer_gating",
    "depformer_layer_scale",
    "layer_scale",
    "bias_proj",
    "norm_emb",
    "quantize",
    "gradient_checkpointing",
}
# Features some Kyutai models use that this engine does not implement.
_UNSUPPORTED_LM_DEFAULTS: dict[str, Any] = {
    "conditioners": None,
    "fuser": None,
    "cross_attention": False,
    "kv_repeat": 1,
    "depformer_weights_per_step_schedule": None,
    "depformer_low_rank_embeddings": None,
    "demux_second_stream": False,
    "demux_second_text_stream": False,
    "extra_heads_num_heads": 0,
    "text_card_out": None,
    "depformer_norm": None,
    "lora": False,
}
_LM_FIELDS = {f.name for f in dataclasses.fields(LMConfig)}


def lm_config_from_kwargs(kw: Mapping[str, Any]) -> LMConfig:
    """Build an :class:`LMConfig` from Kyutai ``LMModel`` kwargs (flat config.json keys)."""
    kw = dict(kw)
    for key, default in _UNSUPPORTED_LM_DEFAULTS.items():
        if key in kw and kw[key] != default and kw[key] not in (None, False, 0, [], {}):
            raise ValueError(f"config.json sets {key}={kw[key]!r}, a feature this engine does not support")
        kw.pop(key, None)
    for key in ("positional_embedding",):
        if kw.get(key, "rope") != "rope":
            raise ValueError(f"config.json sets {key}={kw[key]!r}; only rope is supported for the LM")
    if kw.get("depformer_pos_emb", "none") != "none":
        raise ValueError("only depformer_pos_emb='none' is supported")
    if kw.get("layer_scale") is not None or kw.get("depformer_layer_scale") is not None:
        raise ValueError("LM layer scale is not supported (PersonaPlex and Moshi have none)")
    if kw.get("depformer_gating", kw.get("gating", "silu")) != kw.get("gating", "silu"):
        raise ValueError("the depformer must use the same gating as the temporal transformer")
    args: dict[str, Any] = {}
    for key, value in kw.items():
        if key in _LM_FIELDS:
            if isinstance(value, list):
                value = tuple(value)
            args[key] = value
        elif key not in _IGNORED_LM_KEYS:
            logger.warning("ignoring unknown LM config key %r", key)
    if args.get("existing_text_padding_id") is None:
        args["existing_text_padding_id"] = 3
    return LMConfig(**args)


def mimi_config_from_dict(d: Mapping[str, Any]) -> MimiConfig:
    """Read a Mimi config object (``seanet`` / ``quantizer`` / ``transformer`` sub-objects)."""
    s = dict(d.get("seanet", {}))
    if s.pop("activation", "ELU") != "ELU" or s.pop("norm", "none") != "none":
        raise ValueError("only SEANet with ELU activations and no weight norm (inference layout) is supported")
    for key in ("causal", "disable_norm_outer_blocks"):
        s.pop(key, None)
    if "ratios" in s:
        s["ratios"] = tuple(s["ratios"])
    seanet = SEANetConfig(**s)
    q = dict(d.get("quantizer", {}))
    quant = QuantizerConfig(
        dimension=q.get("dimension", 256),
        n_q=q.get("n_q", 32),
        bins=q.get("bins", 2048),
        input_dimension=q.get("input_dimension", seanet.dimension),
        output_dimension=q.get("output_dimension", seanet.dimension),
        n_q_semantic=q.get("n_q_semantic", 1),
        epsilon=q.get("codebook_epsilon", 1e-5),
    )
    t = dict(d.get("transformer", {}))
    in_dim = t.pop("input_dimension", t["d_model"])
    out_dims = t.pop("output_dimensions", [t["d_model"]])
    if in_dim != t["d_model"] or list(out_dims) != [t["d_model"]]:
        raise ValueError("Mimi transformers with input/output projections are not supported")
    for key in ("causal", "conv_layout"):
        t.pop(key, None)
    transformer = TransformerConfig(**t)
    if d.get("resample_method", "conv") != "conv":
        raise ValueError("only Mimi's learnt-conv resampling is supported")
    return MimiConfig(
        sample_rate=d.get("sample_rate", 24_000),
        frame_rate=d.get("frame_rate", 12.5),
        seanet=seanet,
        quantizer=quant,
        transformer=transformer,
        num_codebooks=d.get("num_codebooks", 8),
        upsample_channel_wise=d.get("upsample_channel_wise_bug", True),
    )


def prompt_config_from_dict(d: Mapping[str, Any] | None) -> PromptConfig:
    """Read the ``personaplex`` object; missing keys keep the real PersonaPlex constants."""
    if not d:
        return PromptConfig()
    base = PromptConfig()
    return PromptConfig(
        silence_tokens=tuple(d.get("silence_tokens", base.silence_tokens)),
        sine_tokens=tuple(d.get("sine_tokens", base.sine_tokens)),
        zero_text_code=d.get("zero_text_code", base.zero_text_code),
        silence_frames=d.get("audio_silence_frame_cnt", base.silence_frames),
        wrap_template=d.get("text_prompt_wrap", base.wrap_template),
    )


def reference_from_kyutai_dict(raw: Mapping[str, Any], lm: LMConfig) -> str:
    """Which reference a checkpoint follows: its ``reference`` key, else what it looks like.

    Kyutai's own Moshi models (``dep_q < n_q``: the depformer predicts only
    the agent's codebooks, and no ``personaplex`` object) follow Kyutai's
    ``moshi``.  Everything else is PersonaPlex: a ``personaplex`` object,
    PersonaPlex's empty ``config.json`` (the official PersonaPlex-7B), or
    ``dep_q == n_q`` (a depformer over the user's codebooks too, which only
    PersonaPlex's rules can teacher-force: Kyutai's ``LMGen`` would take no
    user audio at all).
    """
    if "reference" in raw:
        check_reference(raw["reference"])
        return raw["reference"]
    if "personaplex" in raw or lm.dep_q == lm.n_q:
        return "personaplex"
    return "kyutai"


def config_from_kyutai_dict(raw: Mapping[str, Any], name: str, mimi: Mapping[str, Any] | None = None) -> ModelConfig:
    """Build a :class:`ModelConfig` from a checkpoint's ``config.json`` object.

    Without LM keys (PersonaPlex ships an empty ``config.json``) the official
    PersonaPlex-7B LM is assumed; without a Mimi object, the real Mimi.
    ``mimi`` overrides the ``mimi`` key (Kyutai's separate ``mimi_config_name``
    file).  The reference comes from :func:`reference_from_kyutai_dict`; the
    system prompt runs only under PersonaPlex's.
    """
    lm_kwargs = {k: v for k, v in raw.items() if k not in _NON_LM_KEYS}
    lm = lm_config_from_kwargs(lm_kwargs) if lm_kwargs else LMConfig()
    mimi_dict = mimi if mimi is not None else raw.get("mimi")
    mimi_cfg = mimi_config_from_dict(mimi_dict) if mimi_dict else MimiConfig()
    if mimi_dict is None or "num_codebooks" not in mimi_dict:
        mimi_cfg = dataclasses.replace(mimi_cfg, num_codebooks=lm.num_agent_codebooks)
    reference = reference_from_kyutai_dict(raw, lm)
    prompt = dataclasses.replace(prompt_config_from_dict(raw.get("personaplex")), enabled=reference == "personaplex")
    if reference == "kyutai" and "personaplex" in raw:
        logger.info("%s follows Kyutai's reference: its personaplex prompt constants are not used", name)
    return ModelConfig(
        name=name,
        lm=lm,
        mimi=mimi_cfg,
        prompt=prompt,
        lm_gen=dict(raw.get("lm_gen_config", {})),
        reference=reference,
    )


def config_to_kyutai_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The inverse of :func:`config_from_kyutai_dict` (used to write the tiny checkpoint)."""
    lm = {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg.lm).items() if k != "reference"
    }
    m = cfg.mimi
    t = dataclasses.asdict(m.transformer)
    del t["reference"]
    t.update(input_dimension=t["d_model"], output_dimensions=[t["d_model"]], causal=True, conv_layout=True)
    seanet = dataclasses.asdict(m.seanet)
    seanet["ratios"] = list(seanet["ratios"])
    q = dataclasses.asdict(m.quantizer)
    q["codebook_epsilon"] = q.pop("epsilon")
    p = cfg.prompt
    return {
        "model_type": "personaplex",
        "reference": cfg.reference,
        "moshi_name": LM_FILE,
        "mimi_name": MIMI_FILE,
        "tokenizer_name": TOKENIZER_FILE,
        **lm,
        "mimi": {
            "sample_rate": m.sample_rate,
            "frame_rate": m.frame_rate,
            "channels": 1,
            "resample_method": "conv",
            "upsample_channel_wise_bug": m.upsample_channel_wise,
            "num_codebooks": m.num_codebooks,
            "seanet": seanet,
            "quantizer": q,
            "transformer": t,
        },
        "personaplex": {
            "silence_tokens": list(p.silence_tokens),
            "sine_tokens": list(p.sine_tokens),
            "zero_text_code": p.zero_text_code,
            "audio_silence_frame_cnt": p.silence_frames,
            "text_prompt_wrap": p.wrap_template,
        },
    }
