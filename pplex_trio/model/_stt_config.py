"""Kyutai's streaming speech-to-text checkpoints: their ``config.json``, read into a :class:`STTConfig`.

Kyutai's STT models (``kyutai/stt-1b-en_fr``, ``kyutai/stt-2.6b-en``) are
Moshi LMs without a depformer (``dep_q`` 0): the temporal transformer reads
the caller's ``n_q`` (32) Mimi codebooks plus its own previous text token
and predicts one text token per 80 ms frame.  The text runs
``stt_config.audio_delay_seconds`` behind the audio (0.5 s for the 1B model,
2.5 s for the 2.6B one): the delay is in the training data, not in the
streams' ``delays`` (all 0 in both).  The 1B model also has *extra heads*
(``extra_heads_num_heads`` linear heads of ``extra_heads_dim`` classes on
the transformer's output), its semantic voice-activity detector: the
probability of class :data:`END_OF_TURN_INDEX` of head
:data:`END_OF_TURN_HEAD` is the probability that the speaker's turn has
ended (Kyutai's delayed-streams-modeling scripts read ``heads[2][..., 0]``).

Their ``config.json`` is moshi's ``CheckpointInfo`` convention: flat
``LMModel`` kwargs plus ``stt_config`` (``audio_silence_prefix_seconds``,
``audio_delay_seconds``), ``lm_gen_config``, ``model_type`` (``"stt"``),
``moshi_name``, ``mimi_name``, ``tokenizer_name`` and optionally
``mimi_config_name`` (a separate JSON file describing Mimi; without it the
real Mimi).  They follow Kyutai's reference (``moshi`` 0.2.13): the KV
ring's window is ``"kyutai"``'s.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from .._sources import STT_DEFAULT_REPO
from ._config import MimiConfig, TransformerConfig
from ._kyutai_config import mimi_config_from_dict

logger = logging.getLogger(__name__)

END_OF_TURN_HEAD = 2
"""The extra head whose class :data:`END_OF_TURN_INDEX` is the end-of-turn probability (Kyutai's scripts)."""
END_OF_TURN_INDEX = 0
"""The class of :data:`END_OF_TURN_HEAD` that means "the turn has ended"."""

STT_REPOS = (STT_DEFAULT_REPO, "kyutai/stt-2.6b-en")
"""Kyutai's published streaming STT checkpoints (English and French with end-of-turn heads; English only)."""

# config.json keys that are not LMModel kwargs, or LMModel kwargs that do not matter without a depformer.
_NOT_LM = {
    "model_type",
    "moshi_name",
    "mimi_name",
    "tokenizer_name",
    "mimi_config_name",
    "lm_gen_config",
    "stt_config",
    "model_id",
    "lora_name",
    "tts_config",
    "mimi",
    "notes",
}
_IGNORED = {
    "causal",
    "positional_embedding",
    "layer_scale",
    "cross_attention",
    "conditioners",
    "fuser",
    "quantize",
    "gradient_checkpointing",
    "norm_emb",
    "bias_proj",
    "dep_q",
    "kv_repeat",
    "demux_second_stream",
    "demux_second_text_stream",
    "text_card_out",
}
# Kwargs that must keep Kyutai's default for this implementation (the value it accepts first).
_REQUIRED = {
    "causal": (True,),
    "positional_embedding": ("rope",),
    "layer_scale": (None,),
    "cross_attention": (False, None),
    "conditioners": (None, {}),
    "fuser": (None,),
    "norm_emb": (False,),
    "bias_proj": (False,),
    "kv_repeat": (1,),
    "demux_second_stream": (False,),
    "demux_second_text_stream": (False,),
    "text_card_out": (None,),
}


@dataclasses.dataclass(frozen=True)
class STTConfig:
    """A Kyutai streaming STT model: its LM (no depformer), its Mimi, its timing.

    Field names follow Kyutai's ``LMModel`` kwargs and ``stt_config``.
    ``mimi.num_codebooks`` equals ``n_q``: the model reads that many levels of
    the caller's Mimi codes.
    """

    name: str
    dim: int = 2048
    num_heads: int = 16
    num_layers: int = 16
    hidden_scale: float = 4.125
    context: int = 750
    max_period: float = 100_000.0
    norm: str = "rms_norm_f32"
    gating: str = "silu"
    text_card: int = 8000
    card: int = 2048
    n_q: int = 32
    delays: tuple[int, ...] = (0,) * 33
    existing_text_padding_id: int = 3
    end_of_text_padding_id: int = 0
    extra_heads_num_heads: int = 0
    extra_heads_dim: int = 6
    audio_delay_seconds: float = 0.5
    audio_silence_prefix_seconds: float = 0.0
    mimi: MimiConfig = MimiConfig(num_codebooks=32, reference="kyutai")
    lm_gen: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.delays) != self.n_q + 1:
            raise ValueError(
                f"model {self.name}: expected {self.n_q + 1} delays (text + {self.n_q} audio), got {len(self.delays)}"
            )
        if self.mimi.quantizer.n_q < self.n_q:
            raise ValueError(
                f"model {self.name} reads {self.n_q} Mimi codebooks but its Mimi stores "
                f"{self.mimi.quantizer.n_q}: pick the Mimi this model was trained with"
            )
        if self.mimi.num_codebooks != self.n_q or self.mimi.reference != "kyutai":
            object.__setattr__(self, "mimi", dataclasses.replace(self.mimi, num_codebooks=self.n_q, reference="kyutai"))

    @property
    def num_streams(self) -> int:
        """Token streams per frame: text + ``n_q`` audio codebooks (33)."""
        return self.n_q + 1

    @property
    def max_delay(self) -> int:
        """The largest stream delay in frames (0 for Kyutai's STT models)."""
        return max(self.delays)

    @property
    def frame_rate(self) -> float:
        """Frames (text tokens) per second: Mimi's 12.5."""
        return self.mimi.frame_rate

    @property
    def has_end_of_turn(self) -> bool:
        """Whether the model has the extra head that predicts the end of the speaker's turn."""
        return self.extra_heads_num_heads > END_OF_TURN_HEAD and self.extra_heads_dim > END_OF_TURN_INDEX

    @property
    def temporal(self) -> TransformerConfig:
        """The temporal transformer's config (Kyutai's ring rule)."""
        return TransformerConfig(
            d_model=self.dim,
            num_heads=self.num_heads,
            num_layers=self.num_layers,
            dim_feedforward=int(self.hidden_scale * self.dim),
            context=self.context,
            norm=self.norm,
            gating=self.gating,
            max_period=self.max_period,
            reference="kyutai",
        )


def stt_config_from_dict(raw: Mapping[str, Any], name: str, mimi: Mapping[str, Any] | None = None) -> STTConfig:
    """Read a Kyutai STT checkpoint's ``config.json`` object (``mimi``: its ``mimi_config_name`` file, if any).

    Error handling: ``ValueError`` naming the key when the checkpoint is not a
    speech-to-text model (``dep_q`` not 0) or uses a feature this
    implementation does not have.
    """
    if raw.get("dep_q", 0) != 0:
        raise ValueError(
            f"model {name}: dep_q is {raw['dep_q']}, so it speaks; a speech-to-text checkpoint has "
            "dep_q 0 (use it as the conversation model instead)"
        )
    if raw.get("model_type", "stt") != "stt":
        logger.warning("%s: model_type is %r, read as a speech-to-text model", name, raw["model_type"])
    for key, accepted in _REQUIRED.items():
        if key in raw and raw[key] not in accepted:
            raise ValueError(f"model {name}: config.json sets {key}={raw[key]!r}, which this engine does not support")
    fields = {f.name for f in dataclasses.fields(STTConfig)} - {"name", "mimi", "lm_gen"}
    args: dict[str, Any] = {}
    for key, value in raw.items():
        if key in fields:
            args[key] = tuple(value) if isinstance(value, list) else value
        elif key == "existing_text_end_padding_id":
            args["end_of_text_padding_id"] = value
        elif key not in _NOT_LM and key not in _IGNORED and not key.startswith("depformer"):
            logger.warning("%s: ignoring unknown config key %r", name, key)
    if args.get("existing_text_padding_id") is None:
        args["existing_text_padding_id"] = 3
    stt = dict(raw.get("stt_config") or {})
    mimi_dict = mimi if mimi is not None else raw.get("mimi")
    mimi_cfg = mimi_config_from_dict(mimi_dict) if mimi_dict else MimiConfig()
    return STTConfig(
        name=name,
        **args,
        mimi=mimi_cfg,
        lm_gen=dict(raw.get("lm_gen_config") or {}),
        audio_delay_seconds=float(stt.get("audio_delay_seconds", 0.0)),
        audio_silence_prefix_seconds=float(stt.get("audio_silence_prefix_seconds", 0.0)),
    )


def stt_config_to_dict(cfg: STTConfig, mimi_config_name: str | None = None) -> dict[str, Any]:
    """The inverse of :func:`stt_config_from_dict`: a ``config.json`` in Kyutai's layout (the tiny STT's).

    With ``mimi_config_name`` the Mimi is described by that separate file
    (:func:`mimi_config_to_dict`), as Kyutai's loaders expect.
    """
    lm = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name
        not in (
            "name",
            "mimi",
            "lm_gen",
            "audio_delay_seconds",
            "audio_silence_prefix_seconds",
            "end_of_text_padding_id",
        )
    }
    lm["delays"] = list(cfg.delays)
    out: dict[str, Any] = {
        **lm,
        "dep_q": 0,
        "existing_text_end_padding_id": cfg.end_of_text_padding_id,
        "causal": True,
        "positional_embedding": "rope",
        "layer_scale": None,
        "cross_attention": False,
        "model_type": "stt",
        "depformer_multi_linear": True,  # (as published: else moshi builds an unused depformer_in.0)
        "lm_gen_config": dict(cfg.lm_gen),
        "stt_config": {
            "audio_delay_seconds": cfg.audio_delay_seconds,
            "audio_silence_prefix_seconds": cfg.audio_silence_prefix_seconds,
        },
    }
    if mimi_config_name is not None:
        out["mimi_config_name"] = mimi_config_name
    return out


def mimi_config_to_dict(m: MimiConfig) -> dict[str, Any]:
    """A Mimi config object that both :func:`~pplex_trio.model._kyutai_config.mimi_config_from_dict` and
    moshi 0.2.13's ``loaders.get_mimi`` read (no codebook epsilon: moshi's is fixed at 1e-5)."""
    if m.quantizer.epsilon != 1e-5:
        raise ValueError("moshi's Mimi has a fixed codebook epsilon of 1e-5")
    t = dataclasses.asdict(m.transformer)
    del t["reference"]
    t.update(input_dimension=t["d_model"], output_dimensions=[t["d_model"]], causal=True, conv_layout=True)
    seanet = dataclasses.asdict(m.seanet)
    seanet.update(
        ratios=list(seanet["ratios"]), activation="ELU", norm="none", causal=True, disable_norm_outer_blocks=0
    )
    q = dataclasses.asdict(m.quantizer)
    del q["epsilon"]
    return {
        "sample_rate": m.sample_rate,
        "frame_rate": m.frame_rate,
        "channels": 1,
        "resample_method": "conv",
        "upsample_channel_wise_bug": m.upsample_channel_wise,
        "num_codebooks": m.num_codebooks,
        "seanet": seanet,
        "quantizer": q,
        "transformer": t,
    }
