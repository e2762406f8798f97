"""PersonaPlexEngine's contract on the tiny model, and the package's public API."""

from __future__ import annotations

import numpy as np
import pytest

import pplex_trio.model
from pplex_trio._voice_catalogue import OFFICIAL_VOICES
from pplex_trio.engine._interface import Conversation, ConversationRejected, Engine, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import VoiceNotFoundError, persona_tokens


@pytest.fixture
def engine(tiny_model) -> PersonaPlexEngine:
    return PersonaPlexEngine(tiny_model, 2)


def test_engine_basics(engine, tiny_model):
    assert isinstance(engine, Engine) and engine.name == "tiny" and engine.num_slots == 2
    assert list(engine.voices()) == list(OFFICIAL_VOICES)  # tiny speaks the official client's voice names
    assert engine.frame_size == 1920 and engine.sample_rate == 24_000


def test_prefill_count_is_voice_silence_persona_silence(engine, tiny_model):
    persona = "You are a wise and friendly teacher."
    n_persona = len(persona_tokens(tiny_model.tokenizer, persona))
    assert n_persona > 5
    assert engine.start(0, Conversation(persona=persona, voice="NATF1.pt")) == 24 + 6 + n_persona + 6
    assert engine.start(1, Conversation(persona="", voice="NATF1.pt")) == 24 + 12  # no persona, no persona steps
    # Already wrapped personas are not wrapped again.
    wrapped = "<system> " + persona + " <system>"
    assert persona_tokens(tiny_model.tokenizer, wrapped) == persona_tokens(tiny_model.tokenizer, persona)


def test_no_voice_prompt_drops_the_reference_initial_call(tiny_model):
    engine = PersonaPlexEngine(tiny_model, 1, default_voice="")
    assert engine.start(0, Conversation(persona="")) == 6 + 6 - 1


def test_default_voice_is_the_first_of_the_library(engine):
    assert engine.default_voice == "NATF0.pt"
    assert engine.start(0, Conversation(persona="")) == 24 + 12


@pytest.mark.parametrize("voice", ["../NATF0.pt", "NATF9.pt", "NATF0.wav"])
def test_bad_voice_is_refused_and_leaves_the_slot_alone(engine, voice):
    with pytest.raises(ConversationRejected, match="voice") as info:
        engine.start(0, Conversation(voice=voice))
    assert isinstance(info.value.__cause__, VoiceNotFoundError)


def test_errors_are_clear(engine):
    silence = np.zeros((2, 1920), np.float32)
    engine.start(0, Conversation())
    with pytest.raises(RuntimeError, match="prompt steps to run: call start"):
        engine.step([SlotMode.LIVE, SlotMode.IDLE], silence)
    with pytest.raises(IndexError):
        engine.start(2, Conversation())
    with pytest.raises(ValueError, match="expected 2 modes"):
        engine.step([SlotMode.IDLE], silence)


def test_conversation_runs_and_can_be_reset(engine):
    steps = engine.start(0, Conversation(persona="Hello.", sampling=Sampling(text_seed=1, audio_seed=1)))
    silence = np.zeros((2, 1920), np.float32)
    assert engine.prefill({0: steps - 3}) == {0: steps - 3} and engine.prompt_left(0) == 3
    assert engine.prefill({0: 100}) == {0: 3} and engine.prompt_left(0) == 0  # never more than it had left
    out = engine.step([SlotMode.IDLE, SlotMode.IDLE], silence)
    assert (out.pcm == 0).all() and out.text == [None, None]  # nothing comes out of idle rows
    noise = (0.1 * np.random.RandomState(0).randn(2, 1920)).astype(np.float32)
    outs = [engine.step([SlotMode.LIVE, SlotMode.IDLE], noise) for _ in range(20)]
    assert all(o.pcm.dtype == np.float32 and o.pcm.shape == (2, 1920) for o in outs)
    assert max(np.abs(o.pcm[0]).max() for o in outs) > 1e-3 and all((o.pcm[1] == 0).all() for o in outs)
    assert any(o.text[0] for o in outs)  # the random tiny model does say something
    engine.reset(0)
    engine.reset_all()
    engine.start(1, Conversation())
    with pytest.raises(RuntimeError):
        engine.step([SlotMode.IDLE, SlotMode.LIVE], silence)


EXPORTS = {
    "CONFIGS",
    "CheckpointMismatchError",
    "DEFAULT_REPO",
    "Depformer",
    "FREE",
    "LMConfig",
    "LMGen",
    "LMModel",
    "LoadedModel",
    "Mimi",
    "MimiConfig",
    "MimiDecoderState",
    "MimiEncoderState",
    "ModelAccessError",
    "ModelConfig",
    "PromptConfig",
    "PromptPlan",
    "QuantizerConfig",
    "REFERENCES",
    "RowNoise",
    "RowSampling",
    "SEANetConfig",
    "StepInputs",
    "StepResult",
    "StreamDecoder",
    "StreamingTransformer",
    "TextTokenizer",
    "TokenCache",
    "TransformerConfig",
    "TransformerState",
    "UNGENERATED",
    "VoiceLibrary",
    "VoiceMaking",
    "VoiceNotFoundError",
    "VoicePrompt",
    "build_lm",
    "build_mimi",
    "build_prompt_plan",
    "cache_dir",
    "check_voice_name",
    "config_from_kyutai_dict",
    "config_to_kyutai_dict",
    "convert_kyutai_state_dict",
    "ensure_tiny_checkpoint",
    "expand_depformer_steps",
    "load_config",
    "load_model",
    "lm_dtype_for",
    "load_state_dict_strict",
    "lm_config_from_kwargs",
    "make_voice_prompt",
    "mimi_config_from_dict",
    "persona_tokens",
    "random_model",
    "resolve_checkpoint",
    "ring_attention_mask",
    "sample",
    "voice_from_recording",
    "wrap_persona",
    "write_quantized",
    # speech to text: the caller's words
    "DEFAULT_STT_REPO",
    "END_OF_TURN_HEAD",
    "END_OF_TURN_INDEX",
    "LoadedTranscriber",
    "STTConfig",
    "STTState",
    "STT_REPOS",
    "SpeechToText",
    "TINY_STT",
    "Transcriber",
    "TranscriptStep",
    "TurnEnd",
    "Word",
    "WordAssembler",
    "ensure_tiny_stt_checkpoint",
    "is_end_of_turn",
    "load_stt_config",
    "load_transcriber",
    "stt_config_from_dict",
}


def test_public_api_is_exactly_the_documented_one():
    public = {n for n in dir(pplex_trio.model) if not n.startswith("_")}
    assert public == EXPORTS
    for name in EXPORTS:
        assert name.isupper() or getattr(pplex_trio.model, name).__module__.startswith("pplex_trio.")


def test_kyutai_moshi_models_have_no_system_prompt(tiny_model):
    import dataclasses

    from pplex_trio.model import LMConfig, LoadedModel, config_from_kyutai_dict

    moshi = config_from_kyutai_dict({"dim": 64, "dep_q": 8, "n_q": 16}, "a-moshi")
    assert not moshi.prompt.enabled and config_from_kyutai_dict({}, "pp").prompt.enabled
    cfg = dataclasses.replace(tiny_model.config, prompt=dataclasses.replace(tiny_model.config.prompt, enabled=False))
    engine = PersonaPlexEngine(dataclasses.replace(tiny_model, config=cfg), 1)
    assert engine.start(0, Conversation(persona="Ignored.", voice="NATF0.pt")) == 0
    out = engine.step([SlotMode.LIVE], np.zeros((1, 1920), np.float32))
    assert out.pcm.shape == (1, 1920) and out.text == [None]  # the first frame exists only as silence
    assert isinstance(LMConfig(), LMConfig) and isinstance(engine.model, LoadedModel)


def test_unknown_default_voice_is_refused(tiny_model):
    with pytest.raises(ValueError, match="NATF0.pt, NATF1.pt"):
        PersonaPlexEngine(tiny_model, 1, default_voice="NOPE.pt")
