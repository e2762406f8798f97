"""``pplex-trio compare``: the candidate is teacher-forced on the reference's tokens, and the report says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pplex_trio._cli import main
from pplex_trio.engine._compare import compare
from pplex_trio.engine._interface import Conversation, Sampling
from pplex_trio.engine._personaplex import PersonaPlexEngine


def test_a_candidate_equal_to_the_reference_agrees_everywhere(golden_model, golden):
    """Same weights on both sides: teacher forcing must reproduce the reference's very logits, step after
    step (a candidate that ran free, or saw other tokens, would drift from the sampled ones)."""
    pcm = golden.input_pcm[: 40 * 1920]
    conversation = Conversation(
        persona=golden.persona, voice=golden.voice, sampling=Sampling(text_seed=1, audio_seed=2)
    )
    result = compare(PersonaPlexEngine(golden_model, 1), PersonaPlexEngine(golden_model, 1), conversation, pcm)
    assert result.text_agree.shape == (40,) and result.audio_agree.shape == (40, 8)
    assert result.text_agree.all() and result.audio_agree.all()
    assert not result.text_kl.any() and not result.audio_kl.any()  # exactly 0: the very same logits
    summary = result.summary()
    assert summary["window_steps"] == 20 and summary["first"]["text_top1"] == 1.0


@pytest.mark.parametrize(
    "options",
    [["--quantize", "int8"], ["--kv-cache", "fp8"], ["--quantize", "int8", "--kv-cache", "fp8"]],
    ids=" ".join,
)
def test_compare_reports_a_table_and_per_step_json(options, golden_dir, golden, tmp_path, capsys):
    out = tmp_path / "compare.json"
    wav = str(golden_dir / "input.wav")
    assert (
        main(
            [
                "compare",
                "--model",
                str(golden_dir),
                *options,
                "--input-wav",
                wav,
                "--text-prompt",
                golden.persona,
                "--voice-prompt",
                golden.voice,
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    figures = json.loads(out.read_text())
    frames = -(-len(golden.input_pcm) // 1920)
    summary, steps = figures["summary"], figures["per_step"]
    assert summary["steps"] == len(steps) == frames
    assert len(steps[0]["audio_top1"]) == len(summary["audio_kl_per_codebook"]) == 8
    mean_kl = np.mean([s["text_kl"] for s in steps])
    assert summary["all"]["text_kl"] == pytest.approx(mean_kl)
    assert 0.5 < summary["all"]["text_top1"] <= 1
    # The options took effect: the same weights on both sides give a KL of exactly 0 (the test above), these
    # candidates a small one (the golden model's distributions barely move: some 1e-7 here).
    assert 0 < summary["all"]["text_kl"] < 1e-4 and 0 < summary["all"]["audio_kl"] < 1e-4, summary["all"]
    assert "text top-1" in text and "first" in text and "last" in text and "ms per step" in text


def test_compare_needs_something_to_compare(golden_dir, caplog):
    assert main(["compare", "--model", str(golden_dir), "--input-wav", str(golden_dir / "input.wav")]) == 2
    assert "nothing to compare" in caplog.text
