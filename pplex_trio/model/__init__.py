"""Our own torch implementation of PersonaPlex / Moshi inference.

Token-exact against NVIDIA's PersonaPlex reference (see ``tests/model``),
batched over conversation slots, every streaming state an explicit object
with per-row reset, static shapes.  ``pplex_trio`` never imports ``moshi``.

Loading
-------
``load_model(source, device="cpu", voice_dir=None) -> LoadedModel`` where
``load_config(source)`` reads only the config (named, folder or repo id);
``source`` is ``"tiny"`` (random weights, built once into the cache
folder), a Hugging Face repo id (default ``nvidia/personaplex-7b-v1``;
uses ``HF_TOKEN``) or a local folder with the same files.  ``LoadedModel``
has ``config``, ``lm`` (:class:`LMModel`), ``mimi`` (:class:`Mimi`),
``tokenizer`` (:class:`TextTokenizer`) and ``voices`` (:class:`VoiceLibrary`).
Config dicts in Kyutai's convention: ``config_from_kyutai_dict(raw, name)``
(``REFERENCES``: the values of ``ModelConfig.reference``);
``build_lm(lm_kwargs)`` / ``build_mimi(mimi_config_or_None)`` build modules
with uninitialised weights from Kyutai's dicts (``loaders._lm_kwargs``,
``loaders._mimi_config``).  ``load_state_dict_strict(module, state_dict)``
loads exactly (error lists missing/unexpected keys); call ``mimi.refresh()``
after loading Mimi weights.  ``convert_kyutai_state_dict(sd)`` turns the
state dict of a *live* Kyutai 0.2.x ``LMModel`` or ``MimiModel``
(``in_projs.{i}.weight``) into the file layout we use (``in_proj_weight``),
e.g. ``load_state_dict_strict(ours, convert_kyutai_state_dict(
theirs.state_dict()))``.

Mimi (``Mimi``)
---------------
``state = mimi.init_encoder_state(B)``; ``mimi.encode_frame(pcm[B, 1920],
state, exec_mask) -> codes[B, 8]``; ``state = mimi.init_decoder_state(B)``;
``mimi.decode_frame(codes[B, 8], state, exec_mask) -> pcm[B, 1920]``;
``state.reset(mask[B])``; ``encode_latent`` (before quantization).

LM (``LMModel`` + ``LMGen``)
----------------------------
``gen = LMGen(lm, B, depformer_steps=None)``; ``gen.step(StepInputs(tokens
[B, 17], exec_mask[B], ...), sampling=None, noise=None) -> StepResult``
(``tokens [B, 17]``: the de-delayed frame, ``valid [B]``, optionally
logits and the input embedding); ``gen.reset(mask)``.  In
``StepInputs.tokens``, ``FREE`` (-1) means "model chooses"; anything else
is forced (teacher forcing).  Low level: ``lm.embed``, ``lm.temporal``,
``lm.depformer_step``.

Two references (``ModelConfig.reference``)
------------------------------------------
Each checkpoint follows one reference, read from its ``config.json``
(explicit ``"reference"`` key; else a ``personaplex`` object, PersonaPlex's
empty ``config.json`` or ``dep_q == n_q`` mean ``"personaplex"``, and
Kyutai's own Moshi models, ``dep_q < n_q`` without that object, mean
``"kyutai"``).  They differ in exactly two rules, both static-shaped:

* **ring window** (``ring_attention_mask(end, num_new, capacity,
  reference)``, in the LM's and Mimi's transformers): a full ring attends
  to ``capacity - 1`` keys under ``"personaplex"`` (NVIDIA's fork, the
  reference of the golden data), to ``capacity`` keys under ``"kyutai"``
  (moshi 0.2.13);
* **user timing** (``LMGen``): under ``"personaplex"`` the user's audio
  enters one call later: our call ``n`` given user frames ``u_0..u_n``
  equals Kyutai's ``LMGen.step`` call ``n`` given ``u_{n-1}``; under
  ``"kyutai"`` our call ``n`` equals Kyutai's call ``n`` given ``u_n``.
  Both return nothing on call 0 (``valid`` False) and the same 9 first
  streams afterwards (``tests/model/test_oracle_lmgen.py``,
  ``tests/oracle``).

The system prompt (voice, persona) runs only under ``"personaplex"``; its
constants must fit the model's vocabularies (``ValueError`` at load time
otherwise).  In both, the depformer attends to all earlier steps of the
frame (as trained and as Kyutai does); NVIDIA's fork drops step 0 from its
last step (15, a discarded user codebook), so only that step's logits
differ from it.  Only the agent's depformer steps run by default.

Speech to text (the caller's words)
-----------------------------------
``load_transcriber(source=DEFAULT_STT_REPO, device="cpu") ->
LoadedTranscriber`` (``config`` :class:`STTConfig`, ``model``
:class:`SpeechToText`, ``mimi``, ``tokenizer``) loads Kyutai's streaming STT
(``STT_REPOS``; ``TINY_STT`` is a random-weight one, built once by
``ensure_tiny_stt_checkpoint``); ``load_stt_config(source)`` reads only its config.  ``t = Transcriber(model, B)``;
``t.step(codes[B, 32], exec_mask) -> TranscriptStep`` (``text [B]``,
``valid``, ``extra_heads [B, heads, dim]``, ``end_of_turn [B]`` or None);
``t.reset(mask)``.  The codes come from the same Mimi encode as
PersonaPlex's: ``mimi.encode_frame(pcm, state, mask, num_codebooks=32)``,
whose first 8 levels are PersonaPlex's codes bit for bit.
``WordAssembler`` turns one row's tokens into timed ``Word`` s;
``TurnEnd`` / ``is_end_of_turn`` decide the end of a turn.

Engine-level pieces: ``build_prompt_plan`` (system prompt as forced steps),
``RowSampling`` / ``RowNoise`` / ``sample`` (per-row seeded sampling),
``StreamDecoder`` (incremental detokenization), ``VoiceMaking`` / ``make_voice_prompt``
(voice ``.pt`` from audio), ``random_model`` (any config with random
weights, on its device: benchmarks of shapes whose weights are not here).  The ``pplex-trio offline`` command is not
here but in ``pplex_trio._cli`` (it drives the engine, which this package
must not import).
"""

from .._sources import DEFAULT_REPO as DEFAULT_REPO
from ..codec import TurnEnd as TurnEnd
from ..codec import Word as Word
from ..codec import WordAssembler as WordAssembler
from ..codec import is_end_of_turn as is_end_of_turn
from ._checkpoint import CheckpointMismatchError as CheckpointMismatchError
from ._checkpoint import convert_kyutai_state_dict as convert_kyutai_state_dict
from ._checkpoint import expand_depformer_steps as expand_depformer_steps
from ._checkpoint import load_state_dict_strict as load_state_dict_strict
from ._config import CONFIGS as CONFIGS
from ._config import REFERENCES as REFERENCES
from ._config import LMConfig as LMConfig
from ._config import MimiConfig as MimiConfig
from ._config import ModelConfig as ModelConfig
from ._config import PromptConfig as PromptConfig
from ._config import QuantizerConfig as QuantizerConfig
from ._config import SEANetConfig as SEANetConfig
from ._config import TransformerConfig as TransformerConfig
from ._depformer import Depformer as Depformer
from ._kyutai_config import config_from_kyutai_dict as config_from_kyutai_dict
from ._kyutai_config import config_to_kyutai_dict as config_to_kyutai_dict
from ._kyutai_config import lm_config_from_kwargs as lm_config_from_kwargs
from ._kyutai_config import mimi_config_from_dict as mimi_config_from_dict
from ._lm import LMModel as LMModel
from ._loading import LoadedModel as LoadedModel
from ._loading import ModelAccessError as ModelAccessError
from ._loading import build_lm as build_lm
from ._loading import build_mimi as build_mimi
from ._loading import cache_dir as cache_dir
from ._loading import lm_dtype_for as lm_dtype_for
from ._loading import load_config as load_config
from ._loading import load_model as load_model
from ._loading import resolve_checkpoint as resolve_checkpoint
from ._loading import write_quantized as write_quantized
from ._lockstep import FREE as FREE
from ._lockstep import UNGENERATED as UNGENERATED
from ._lockstep import LMGen as LMGen
from ._lockstep import StepInputs as StepInputs
from ._lockstep import StepResult as StepResult
from ._lockstep import TokenCache as TokenCache
from ._mimi import Mimi as Mimi
from ._mimi import MimiDecoderState as MimiDecoderState
from ._mimi import MimiEncoderState as MimiEncoderState
from ._prompt import PromptPlan as PromptPlan
from ._prompt import build_prompt_plan as build_prompt_plan
from ._random import random_model as random_model
from ._sampling import RowNoise as RowNoise
from ._sampling import RowSampling as RowSampling
from ._sampling import sample as sample
from ._streaming import ring_attention_mask as ring_attention_mask
from ._stt_config import END_OF_TURN_HEAD as END_OF_TURN_HEAD
from ._stt_config import END_OF_TURN_INDEX as END_OF_TURN_INDEX
from ._stt_config import STT_REPOS as STT_REPOS
from ._stt_config import STTConfig as STTConfig
from ._stt_config import stt_config_from_dict as stt_config_from_dict
from ._stt_loading import DEFAULT_STT_REPO as DEFAULT_STT_REPO
from ._stt_loading import TINY_STT as TINY_STT
from ._stt_loading import LoadedTranscriber as LoadedTranscriber
from ._stt_loading import load_stt_config as load_stt_config
from ._stt_loading import load_transcriber as load_transcriber
from ._text import StreamDecoder as StreamDecoder
from ._text import TextTokenizer as TextTokenizer
from ._text import persona_tokens as persona_tokens
from ._text import wrap_persona as wrap_persona
from ._tiny import ensure_tiny_checkpoint as ensure_tiny_checkpoint
from ._tiny_stt import ensure_tiny_stt_checkpoint as ensure_tiny_stt_checkpoint
from ._transcriber import SpeechToText as SpeechToText
from ._transcriber import STTState as STTState
from ._transcriber import Transcriber as Transcriber
from ._transcriber import TranscriptStep as TranscriptStep
from ._transformer import StreamingTransformer as StreamingTransformer
from ._transformer import TransformerState as TransformerState
from ._voices import VoiceLibrary as VoiceLibrary
from ._voices import VoiceMaking as VoiceMaking
from ._voices import VoiceNotFoundError as VoiceNotFoundError
from ._voices import VoicePrompt as VoicePrompt
from ._voices import check_voice_name as check_voice_name
from ._voices import make_voice_prompt as make_voice_prompt
from ._voices import voice_from_recording as voice_from_recording
