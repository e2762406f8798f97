"""Voice prompts: making one from audio like the reference, and the library's name rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pplex_trio._voice_catalogue import OFFICIAL_VOICES
from pplex_trio.model import VoiceLibrary, VoiceNotFoundError, VoicePrompt, check_voice_name, make_voice_prompt


def test_voice_prompt_from_audio_matches_the_reference_file(golden_model, golden):
    # expected_voicegen/ is the reference run that wrote voices/TINY0.pt from this (normalised) audio.
    pcm = np.load(golden.voicegen / "voice_prompt_pcm_normalized.npy")[0]
    cfg = golden_model.config.prompt
    prompt, codes = make_voice_prompt(golden_model.lm, golden_model.mimi, pcm, cfg.sine_tokens, cfg.zero_text_code)
    np.testing.assert_array_equal(codes, np.load(golden.voicegen / "voice_prompt_codes.npy"))
    ref = VoicePrompt.from_file(golden.root / "voices" / golden.voice)
    assert prompt.embeddings.shape == ref.embeddings.shape == (24, 64)
    assert torch.allclose(prompt.embeddings, ref.embeddings, atol=1e-6, rtol=0)
    assert torch.equal(prompt.cache, ref.cache)


def test_voice_prompt_round_trips_through_a_file(tmp_path, golden, golden_model):
    ref = golden_model.voices.get(golden.voice)
    ref.save(tmp_path / "COPY.pt")
    raw = torch.load(tmp_path / "COPY.pt", weights_only=True)
    assert raw["embeddings"].shape == (24, 1, 1, 64) and raw["cache"].shape == (1, 17, 4)
    again = VoiceLibrary(tmp_path).get("COPY.pt")
    assert torch.equal(again.embeddings, ref.embeddings) and torch.equal(again.cache, ref.cache)


@pytest.mark.parametrize(
    "name",
    [
        "../TINY0.pt",
        "voices/TINY0.pt",
        "TINY0",
        "TINY0.txt",
        "..",
        "",
        ".hidden.pt",
        "a\\b.pt",
        "/etc/passwd",
        "x/../TINY0.pt",
    ],
)
def test_voice_names_outside_the_library_are_refused(name, golden_model):
    with pytest.raises(VoiceNotFoundError, match="voice"):
        check_voice_name(name)
    with pytest.raises(VoiceNotFoundError):
        golden_model.voices.get(name)


def test_unknown_voice_lists_the_available_ones(golden_model):
    with pytest.raises(VoiceNotFoundError, match="TINY0.pt"):
        golden_model.voices.get("NOPE.pt")


def test_tiny_model_has_deterministic_voices(tiny_model):
    assert tiny_model.voices.names() == list(OFFICIAL_VOICES)
    voices = [tiny_model.voices.get(n) for n in tiny_model.voices.names()]
    assert all(v.embeddings.shape == (24, tiny_model.config.lm.dim) for v in voices)
    assert not torch.equal(voices[0].embeddings, voices[1].embeddings)


def test_the_catalogue_is_the_one_listing_rule(tmp_path):
    from pplex_trio._voice_catalogue import voice_files, voice_path
    from pplex_trio.engine import EchoEngine, voices_in_directory

    assert OFFICIAL_VOICES[:5] == ("NATF0.pt", "NATF1.pt", "NATF2.pt", "NATF3.pt", "NATM0.pt")
    assert len(OFFICIAL_VOICES) == 18 and OFFICIAL_VOICES[-1] == "VARM4.pt"
    for name in ("B.pt", "A.pt", ".hidden.pt", "notes.txt", "a..b.pt", "C.wav", "D.FLAC", "E.ogg", "F.mp3"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "folder.pt").mkdir()
    assert (
        voice_files(tmp_path) == ["A.pt", "B.pt", "C.wav", "D.FLAC", "E.ogg", "F.mp3"] == VoiceLibrary(tmp_path).names()
    )
    assert voice_path(tmp_path, "A.pt") == tmp_path / "A.pt"
    with pytest.raises(VoiceNotFoundError, match="available: A.pt, B.pt, C.wav"):
        voice_path(tmp_path, "C.pt")
    with pytest.raises(VoiceNotFoundError, match="invalid voice name"):
        voice_path(tmp_path, "../A.pt")
    with pytest.raises(FileNotFoundError, match="--voice-dir"):
        voice_files(tmp_path / "missing")
    # The echo engine offers the official names, or a folder's by the same rule.
    assert list(EchoEngine(1).voices()) == list(OFFICIAL_VOICES) and voices_in_directory is voice_files
