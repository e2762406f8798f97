"""Two conversations straight through a PersonaPlex engine: the run the compile checks compare
(tests/model/test_engine_compile.py, and ``bench/compile_cpu.py`` on the real inductor)."""

from __future__ import annotations

import numpy as np

from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine

LIVE = SlotMode.LIVE


def drive(engine: PersonaPlexEngine, frames: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Two conversations (one sampled, one greedy) through their prompts and ``frames`` live frames: the
    tokens ``[frames, 2, K]`` and the PCM."""
    voice = engine.model.voices.names()[0]
    engine.prefill(
        {
            0: engine.start(0, Conversation(persona="Hi.", voice=voice, sampling=Sampling(text_seed=1, audio_seed=2))),
            1: engine.start(1, Conversation(persona="Other.", voice=voice, sampling=Sampling(greedy=True))),
        }
    )
    audio = (0.1 * np.random.RandomState(0).randn(frames, 2, 1920)).astype(np.float32)
    tokens, pcm = [], []
    for frame in audio:
        pcm.append(engine.step([LIVE, LIVE], frame).pcm.copy())
        tokens.append(engine.last_tokens.copy())
    return np.stack(tokens), np.stack(pcm)
