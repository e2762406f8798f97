"""Model configuration: the dataclasses, the model constants and the named configs.

A :class:`ModelConfig` is everything needed to *build* the modules (the
weights come later, from a checkpoint or a seeded random init): the LM
(:class:`LMConfig`), the Mimi codec (:class:`MimiConfig`), the PersonaPlex
system-prompt constants (:class:`PromptConfig`) and the *reference* whose
streaming rules the model follows (:data:`REFERENCES`).  :data:`CONFIGS`
names the built-in ones (the official PersonaPlex-7B, ``tiny``).

The reference is one switch, ``ModelConfig.reference``:

``"personaplex"``
    NVIDIA's PersonaPlex fork of Kyutai's ``moshi`` (the reference of the
    golden data): a full streaming KV ring attends to ``context - 1`` keys,
    and the user's audio frame given at an LM step is that step's
    *target* frame, read as input one step later.  The system prompt
    (voice, persona) runs before each conversation.
``"kyutai"``
    Kyutai's ``moshi`` 0.2.13 as published: a full ring attends to
    ``context`` keys, and the user's frame is the *input* of the very step
    it is given to (80 ms less latency).  No system prompt.

It is copied into the sub-configs (``LMConfig.reference``,
``MimiConfig.reference``, ``TransformerConfig.reference``) so each module
reads its own config; :class:`ModelConfig` keeps the copies equal.  Only
two places act on it: :func:`~pplex_trio.model._streaming.ring_attention_mask`
(the ring rule) and :class:`~pplex_trio.model._lockstep.LMGen` (the user
timing).

Reading and writing checkpoints' ``config.json`` (Kyutai's convention) is
:mod:`~pplex_trio.model._kyutai_config`'s job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# File names used by both Kyutai's and NVIDIA's repositories.
LM_FILE = "model.safetensors"
MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_FILE = "tokenizer_spm_32k_3.model"
VOICES_ARCHIVE = "voices.tgz"

# The real PersonaPlex prompt tokens (Mimi codes of 80 ms of silence and of a
# 440 Hz sine), from NVIDIA's reference.
SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
DELAYS_17 = (0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1)

REFERENCES = ("personaplex", "kyutai")
"""The references whose streaming rules a model can follow (see the module docstring)."""


def check_reference(reference: str) -> None:
    """Raise ``ValueError`` (naming the choices) unless ``reference`` is one of :data:`REFERENCES`."""
    if reference not in REFERENCES:
        raise ValueError(f"unknown reference {reference!r}: use one of {', '.join(REFERENCES)}")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A streaming transformer: Helium (the LM's temporal one) or Mimi's.

    ``norm`` is one of ``rms_norm_f32`` (Helium), ``rms_norm``,
    ``layer_norm`` (Mimi) or ``layer_norm_f32``; ``gating`` is ``silu`` (a
    gated FFN, hidden size from :func:`gated_hidden`) or ``none`` (a plain
    ``linear1 -> gelu -> linear2`` FFN).  ``context`` is the capacity of the
    ring KV cache, in steps of this transformer.
    """

    d_model: int
    num_heads: int
    num_layers: int
    dim_feedforward: int
    context: int
    norm: str = "rms_norm_f32"
    gating: str = "silu"
    layer_scale: float | None = None
    max_period: float = 10_000.0
    positional_embedding: str = "rope"
    reference: str = "personaplex"

    def __post_init__(self) -> None:
        check_reference(self.reference)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of num_heads {self.num_heads}")
        if self.positional_embedding not in ("rope", "none"):
            raise ValueError(f"positional_embedding {self.positional_embedding!r} is not supported (rope or none)")


@dataclasses.dataclass(frozen=True)
class SEANetConfig:
    """Mimi's convolutional encoder/decoder (see ``docs/MODEL.md`` for the real values)."""

    channels: int = 1
    dimension: int = 512
    n_filters: int = 64
    n_residual_layers: int = 1
    ratios: tuple[int, ...] = (8, 6, 5, 4)
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    dilation_base: int = 2
    compress: int = 2
    pad_mode: str = "constant"
    true_skip: bool = True

    @property
    def hop_length(self) -> int:
        """Input samples per latent frame of the SEANet encoder: the product of ``ratios`` (960 for Mimi)."""
        hop = 1
        for r in self.ratios:
            hop *= r
        return hop


@dataclasses.dataclass(frozen=True)
class QuantizerConfig:
    """Split RVQ: ``n_q_semantic`` codebooks on one projection, the rest on another."""

    dimension: int = 256
    n_q: int = 32
    bins: int = 2048
    input_dimension: int = 512
    output_dimension: int = 512
    n_q_semantic: int = 1
    epsilon: float = 1e-5


@dataclasses.dataclass(frozen=True)
class MimiConfig:
    """The Mimi codec.  ``reference`` is copied into ``transformer`` (both of Mimi's transformers)."""

    sample_rate: int = 24_000
    frame_rate: float = 12.5
    seanet: SEANetConfig = SEANetConfig()
    quantizer: QuantizerConfig = QuantizerConfig()
    transformer: TransformerConfig = TransformerConfig(
        d_model=512,
        num_heads=8,
        num_layers=8,
        dim_feedforward=2048,
        context=250,
        norm="layer_norm",
        gating="none",
        layer_scale=0.01,
    )
    num_codebooks: int = 8  # codebooks actually used (the file may hold more)
    upsample_channel_wise: bool = True  # Kyutai's "upsample_channel_wise_bug"
    reference: str = "personaplex"

    def __post_init__(self) -> None:
        check_reference(self.reference)
        if self.transformer.reference != self.reference:
            object.__setattr__(self, "transformer", dataclasses.replace(self.transformer, reference=self.reference))

    @property
    def frame_size(self) -> int:
        """Samples per model frame: 1920 at 24 kHz and 12.5 Hz (80 ms)."""
        return int(self.sample_rate / self.frame_rate)

    @property
    def encoder_frame_rate(self) -> float:
        """Frames per second out of the SEANet encoder, before Mimi downsamples to ``frame_rate`` (25 Hz)."""
        return self.sample_rate / self.seanet.hop_length

    @property
    def resample_stride(self) -> int:
        """Encoder frames per model frame (2); ``ValueError`` if the rates do not divide to an integer ≥ 1."""
        stride = self.encoder_frame_rate / self.frame_rate
        if stride != int(stride) or stride < 1:
            raise ValueError(f"Mimi needs an integer resampling stride, got {stride}")
        return int(stride)


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """The Moshi/PersonaPlex LM.  Field names follow Kyutai's ``LMModel`` kwargs.

    ``reference`` (not a Kyutai kwarg) selects the ring rule of the temporal
    transformer and the user-audio timing of :class:`~pplex_trio.model.LMGen`.
    """

    dim: int = 4096
    num_heads: int = 32
    num_layers: int = 32
    hidden_scale: float = 4.125
    context: int = 3000
    max_period: float = 10_000.0
    norm: str = "rms_norm_f32"
    gating: str = "silu"
    text_card: int = 32_000
    card: int = 2048
    n_q: int = 16
    dep_q: int = 16
    delays: tuple[int, ...] = DELAYS_17
    existing_text_padding_id: int = 3
    end_of_text_padding_id: int = 0
    depformer_dim: int = 1024
    depformer_dim_feedforward: int | tuple[int, ...] = int(4.125 * 1024)
    depformer_num_heads: int = 16
    depformer_num_layers: int = 6
    depformer_multi_linear: bool = True
    depformer_weights_per_step: bool = True
    reference: str = "personaplex"

    def __post_init__(self) -> None:
        check_reference(self.reference)
        if len(self.delays) != self.n_q + 1:
            raise ValueError(f"expected {self.n_q + 1} delays (text + {self.n_q} audio), got {len(self.delays)}")
        if self.n_q % 2:
            raise ValueError("n_q must be even: half agent codebooks, half user codebooks")
        if not 0 < self.dep_q <= self.n_q:
            raise ValueError(f"dep_q must be in 1..n_q, got {self.dep_q}")

    @property
    def num_streams(self) -> int:
        """Token streams per frame: text + n_q audio codebooks (17)."""
        return self.n_q + 1

    @property
    def num_agent_codebooks(self) -> int:
        """Codebooks of the agent's own voice (streams 1..8); the rest are the user's."""
        return self.n_q // 2

    @property
    def max_delay(self) -> int:
        """The largest stream delay, in frames: how far the delayed streams lag the text stream."""
        return max(self.delays)

    @property
    def temporal(self) -> TransformerConfig:
        """The temporal transformer's config, derived from the LM's sizes."""
        return TransformerConfig(
            d_model=self.dim,
            num_heads=self.num_heads,
            num_layers=self.num_layers,
            dim_feedforward=int(self.hidden_scale * self.dim),
            context=self.context,
            norm=self.norm,
            gating=self.gating,
            max_period=self.max_period,
            reference=self.reference,
        )

    def depformer_hidden(self, step: int) -> int:
        """Feed-forward hidden width of depformer step ``step`` (per step when the setting is a tuple), sized for
        gating.
        """
        ff = self.depformer_dim_feedforward
        ff = ff[step] if isinstance(ff, tuple) else ff
        return gated_hidden(self.depformer_dim, ff)


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """PersonaPlex system-prompt constants (from the checkpoint's ``personaplex`` object).

    ``enabled`` is False for models that follow Kyutai's reference (its own
    Moshi models): they were not trained with voice and persona prompts, so
    conversations start right away.  When enabled, every token must exist
    in the model's vocabularies (checked by :class:`ModelConfig`).
    """

    enabled: bool = True
    silence_tokens: tuple[int, ...] = SILENCE_TOKENS
    sine_tokens: tuple[int, ...] = SINE_TOKENS
    zero_text_code: int = 3
    silence_frames: int = 6
    wrap_template: str = "<system> {prompt} <system>"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A whole model.  ``reference`` is the one switch between PersonaPlex's and Kyutai's rules.

    It is copied into ``lm`` and ``mimi`` on construction (so
    ``dataclasses.replace(cfg, reference="kyutai")`` switches everything).

    Error handling: ``ValueError`` when the system-prompt tokens do not fit
    the model (e.g. PersonaPlex-7B's silence codes on a 64-entry codebook);
    the message names the ``config.json`` keys to set.
    """

    name: str
    lm: LMConfig = LMConfig()
    mimi: MimiConfig = MimiConfig()
    prompt: PromptConfig = PromptConfig()
    # Default sampling of the checkpoint (Kyutai's ``lm_gen_config``), informational.
    lm_gen: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reference: str = "personaplex"

    def __post_init__(self) -> None:
        check_reference(self.reference)
        for part in ("lm", "mimi"):
            if getattr(self, part).reference != self.reference:
                object.__setattr__(self, part, dataclasses.replace(getattr(self, part), reference=self.reference))
        if self.prompt.enabled:
            check_prompt(self.prompt, self.lm, self.name)


def check_prompt(p: PromptConfig, lm: LMConfig, name: str) -> None:
    """The system-prompt constants must be tokens of this model (raises ``ValueError`` naming the key)."""
    n_agent = lm.num_agent_codebooks
    audio = (("silence_tokens", p.silence_tokens, n_agent), ("sine_tokens", p.sine_tokens, lm.n_q - n_agent))
    for key, tokens, count in audio:
        if len(tokens) != count or not all(0 <= t < lm.card for t in tokens):
            raise ValueError(
                f"model {name}: personaplex.{key} {list(tokens)} must be {count} Mimi codes in 0..{lm.card - 1} "
                f"(the model's codebooks have {lm.card} entries); set personaplex.{key} in config.json to codes of "
                f'this model\'s Mimi, or "reference": "kyutai" to run it without a system prompt'
            )
    if not 0 <= p.zero_text_code < lm.text_card:
        raise ValueError(
            f"model {name}: personaplex.zero_text_code {p.zero_text_code} is not a text token "
            f"(0..{lm.text_card - 1}); fix it in config.json"
        )
    if p.silence_frames < 0:
        raise ValueError(f"model {name}: personaplex.audio_silence_frame_cnt must be >= 0")


def gated_hidden(dim: int, dim_feedforward: int) -> int:
    """Hidden width of a gated FFN, by Kyutai's rule (``4*dim`` is special-cased)."""
    if dim_feedforward == 4 * dim:
        return (21 * dim) // 8
    return (2 * dim_feedforward) // 3


def _tiny_config() -> ModelConfig:
    """Random-weight model for CPU demos and tests: real layout and rules, small dims.

    The context is the real one (3000 frames for the LM, 250 steps for
    Mimi's transformers) so long-call behaviour is the real one too.  The
    prompt tokens are the real ones modulo the tiny codebook size, as in the
    golden set.
    """
    card = 64
    return ModelConfig(
        name="tiny",
        lm=LMConfig(
            dim=64,
            num_heads=4,
            num_layers=2,
            context=3000,
            text_card=400,
            card=card,
            depformer_dim=32,
            depformer_dim_feedforward=64,
            depformer_num_heads=2,
            depformer_num_layers=2,
        ),
        mimi=MimiConfig(
            seanet=SEANetConfig(dimension=32, n_filters=4),
            # 32 levels stored, 8 used, as the real Mimi: a transcriber reads all 32 from the same encode.
            quantizer=QuantizerConfig(dimension=16, n_q=32, bins=card, input_dimension=32, output_dimension=32),
            transformer=TransformerConfig(
                d_model=32,
                num_heads=2,
                num_layers=2,
                dim_feedforward=64,
                context=250,
                norm="layer_norm",
                gating="none",
                layer_scale=0.01,
            ),
        ),
        prompt=PromptConfig(
            silence_tokens=tuple(t % card for t in SILENCE_TOKENS),
            sine_tokens=tuple(t % card for t in SINE_TOKENS),
        ),
    )


CONFIGS: dict[str, ModelConfig] = {
    "personaplex-7b-v1": ModelConfig(name="personaplex-7b-v1"),
    "tiny": _tiny_config(),
}
