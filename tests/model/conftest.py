"""Fixtures for the model tests: the golden checkpoint, its expected outputs, the tiny model."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
import sphn
import torch

from pplex_trio.model import LoadedModel, load_model


@pytest.fixture(scope="session", autouse=True)
def _single_thread_torch():
    # The models here are tiny: threads only add contention (and noise to timings).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory):
    """Build the tiny model in a per-session cache, not in the developer's home."""
    old = os.environ.get("PPLEX_TRIO_CACHE")
    os.environ["PPLEX_TRIO_CACHE"] = str(tmp_path_factory.mktemp("pplex-cache"))
    yield
    if old is None:
        del os.environ["PPLEX_TRIO_CACHE"]
    else:
        os.environ["PPLEX_TRIO_CACHE"] = old


@pytest.fixture(scope="session")
def golden_model(golden_dir: pathlib.Path) -> LoadedModel:
    return load_model(str(golden_dir))


@pytest.fixture(scope="session")
def tiny_model(_private_cache) -> LoadedModel:
    return load_model("tiny")


class Golden:
    """The golden run's inputs and expected outputs (see the golden README)."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        exp = root / "expected"
        self.config = json.loads((root / "config.json").read_text())
        self.persona = self.config["golden"]["text_prompt"]
        self.voice = pathlib.Path(self.config["golden"]["voice_prompt"]).name
        pcm, rate = sphn.read(str(root / "input.wav"))
        assert rate == 24_000
        self.input_pcm = pcm[0].astype(np.float32)
        self.input_codes = np.load(exp / "input_codes.npy")
        self.output_tokens = np.load(exp / "output_tokens.npy")
        self.output_pcm = np.load(exp / "output_pcm.npy")
        self.output_text = json.loads((exp / "output_text.json").read_text())
        self.prompt_tokens = json.loads((exp / "prompt_text_tokens.json").read_text())
        self.step_log = dict(np.load(exp / "step_log.npz"))
        self.lm_only = {
            name: np.load(root / "expected_lm_only" / f"{name}.npy")
            for name in ("transformer_out", "text_logits", "audio_logits", "output_tokens")
        }
        self.voicegen = root / "expected_voicegen"

    def frame(self, i: int) -> np.ndarray:
        return self.input_pcm[i * 1920 : (i + 1) * 1920]


@pytest.fixture(scope="session")
def golden(golden_dir: pathlib.Path) -> Golden:
    return Golden(golden_dir)
