"""Voices given as recordings: the reference's voice generation, token for token.

``expected_voicegen/`` is NVIDIA's run that made ``voices/TINY0.pt`` from
``voices/TINY0.wav`` (its normalised audio, its Mimi codes, and a whole
conversation driven from the wav); nothing expected here is computed by
our code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import sphn
import torch

from pplex_trio.codec._voice_audio import normalize_loudness, read_voice_recording
from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import VoiceLibrary, VoiceNotFoundError, VoicePrompt
from pplex_trio.model._voices import voice_from_recording


@pytest.fixture(scope="module")
def wav(golden_dir):
    return golden_dir / "voices" / "TINY0.wav"


def test_the_recording_is_normalised_as_the_reference_did(wav, golden):
    pcm = normalize_loudness(read_voice_recording(wav, 24_000), 24_000)
    expected = np.load(golden.voicegen / "voice_prompt_pcm_normalized.npy")[0]
    assert pcm.shape == expected.shape
    assert np.abs(pcm - expected).max() < 1e-6


def test_a_voice_from_the_wav_is_the_reference_pt(wav, golden, golden_model):
    cfg = golden_model.config.prompt
    prompt, codes = voice_from_recording(golden_model.lm, golden_model.mimi, wav, cfg.sine_tokens, cfg.zero_text_code)
    np.testing.assert_array_equal(codes, np.load(golden.voicegen / "voice_prompt_codes.npy"))
    ref = VoicePrompt.from_file(golden.root / "voices" / "TINY0.pt")
    assert torch.allclose(prompt.embeddings, ref.embeddings, atol=1e-6, rtol=0)
    assert torch.equal(prompt.cache, ref.cache)
    assert golden_model.voices.get("TINY0.wav").cache.equal(ref.cache)  # the library makes it the same way


def _greedy_run(model, voice: str, golden) -> np.ndarray:
    engine = PersonaPlexEngine(model, 1)
    engine.prefill(
        {0: engine.start(0, Conversation(persona=golden.persona, voice=voice, sampling=Sampling(greedy=True)))}
    )
    tokens = []
    for i in range(len(golden.input_codes)):
        engine.step([SlotMode.LIVE], golden.frame(i)[None])
        tokens.append(engine.last_tokens[0].copy())
    return np.stack(tokens)


def test_a_conversation_with_the_wav_voice_is_the_reference_run(golden_model, golden):
    expected = np.load(golden.voicegen / "output_tokens.npy")
    np.testing.assert_array_equal(_greedy_run(golden_model, "TINY0.wav", golden), expected)


def test_offline_with_a_wav_voice_path_reproduces_voicegen(golden_dir, golden, tmp_path):
    """The issue's command as a user types it: ``--voice-prompt voices/TINY0.wav`` (found in the model folder)."""
    out_wav, out_text = tmp_path / "out.wav", tmp_path / "out.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pplex_trio",
            "offline",
            "--model",
            str(golden_dir),
            "--input-wav",
            str(golden_dir / "input.wav"),
            "--output-wav",
            str(out_wav),
            "--output-text",
            str(out_text),
            "--text-prompt",
            golden.persona,
            "--voice-prompt",
            "voices/TINY0.wav",
            "--greedy",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out_text.read_text()) == json.loads((golden.voicegen / "output_text.json").read_text())
    # The voicegen run's tokens are the .pt run's (a fact of the golden data), so its audio is expected/'s.
    np.testing.assert_array_equal(np.load(golden.voicegen / "output_tokens.npy"), golden.output_tokens)
    ours, _ = sphn.read(str(out_wav))
    assert np.abs(ours[0] - golden.output_pcm).max() <= 1e-4 + 1 / 32767


def test_offline_refuses_a_voice_path_that_is_nowhere(golden_dir, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pplex_trio",
            "offline",
            "--model",
            str(golden_dir),
            "--input-wav",
            str(golden_dir / "input.wav"),
            "--output-wav",
            str(tmp_path / "o.wav"),
            "--output-text",
            str(tmp_path / "o.json"),
            "--voice-prompt",
            "voices/NOPE.wav",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and "voices/NOPE.wav not found" in proc.stderr and "Traceback" not in proc.stderr


# --- recordings of every kind, and the ones that cannot be a voice -------------------------------------


def _library(golden_model, folder) -> VoiceLibrary:
    cfg = golden_model.config.prompt
    return VoiceLibrary(
        folder,
        lambda path: voice_from_recording(
            golden_model.lm, golden_model.mimi, path, cfg.sine_tokens, cfg.zero_text_code
        )[0],
    )


def _speech(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2).astype(np.float32)


def test_any_rate_from_8_to_48_khz_and_stereo_are_taken(golden_model, tmp_path):
    sphn.write_wav(str(tmp_path / "low.wav"), _speech(2.0, 8_000), 8_000)
    stereo = np.stack([_speech(2.0, 48_000), 0.5 * _speech(2.0, 48_000)])
    sphn.write_wav(str(tmp_path / "stereo.wav"), stereo, 48_000)
    lib = _library(golden_model, tmp_path)
    for name, rate in (("low.wav", 8_000), ("stereo.wav", 48_000)):
        prompt = lib.get(name)
        resampled = sphn.resample(_speech(2.0, rate)[None], src_sample_rate=rate, dst_sample_rate=24_000)
        assert prompt.num_steps == -(-resampled.shape[1] // 1920) - 1  # every frame but the first
        assert torch.isfinite(prompt.embeddings).all()
    # Stereo is downmixed to the mean of its channels (then resampled to 24 kHz).
    mono = read_voice_recording(tmp_path / "stereo.wav", 24_000)
    expected = sphn.resample(stereo.mean(axis=0, keepdims=True), src_sample_rate=48_000, dst_sample_rate=24_000)[0]
    assert np.abs(mono - expected).max() < 1e-4


@pytest.mark.parametrize(
    "case, message",
    [
        ("silent", "silent or shorter than 0.4 s"),
        ("short", "silent or shorter than 0.4 s"),
        ("rate", "96000 Hz: give one at 8 to 48 kHz"),
        ("garbage", "not a recording this server can read"),
        ("truncated", "not a recording this server can read|silent or shorter"),
        ("empty", "not a recording this server can read|holds no audio"),
    ],
)
def test_a_recording_that_cannot_be_a_voice_is_refused_in_words(case, message, golden_model, golden_dir, tmp_path):
    path = tmp_path / f"{case}.wav"
    if case == "silent":
        sphn.write_wav(str(path), np.zeros(48_000, dtype=np.float32), 24_000)
    elif case == "short":
        sphn.write_wav(str(path), _speech(0.3, 24_000), 24_000)
    elif case == "rate":
        sphn.write_wav(str(path), _speech(1.0, 96_000), 96_000)
    elif case == "garbage":
        path.write_bytes(b"RIFF" + bytes(range(256)) * 40)
    elif case == "truncated":
        path.write_bytes((golden_dir / "voices" / "TINY0.wav").read_bytes()[:60])
    else:
        path.write_bytes(b"")
    lib = _library(golden_model, tmp_path)
    with pytest.raises(VoiceNotFoundError, match=message):
        lib.get(path.name)
    assert path.name not in lib.names()  # no longer offered once known to be unusable
    with pytest.raises(VoiceNotFoundError, match="cannot be used"):
        lib.get(path.name)  # and the reason is kept


def test_an_engine_makes_the_recordings_of_its_library_when_it_is_built(golden_model, tmp_path, caplog):
    shutil.copy(golden_model.voices.folder / "TINY0.wav", tmp_path / "MINE.wav")
    sphn.write_wav(str(tmp_path / "QUIET.wav"), np.zeros(24_000, dtype=np.float32), 24_000)
    model = golden_model.__class__(**{**golden_model.__dict__, "voices": _library(golden_model, tmp_path)})
    engine = PersonaPlexEngine(model, 1)
    assert list(engine.voices()) == ["MINE.wav"] and engine.default_voice == "MINE.wav"
    assert "QUIET.wav" in caplog.text and "silent" in caplog.text
    assert "MINE.wav" in model.voices._cache  # made at load: a conversation's start does not pay for it
