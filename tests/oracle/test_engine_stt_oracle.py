"""The engine's transcriber (``--model tiny --transcribe tiny``) against moshi 0.2.13's, token for token.

The engine runs three rows of the tiny PersonaPlex with ``tiny-stt`` beside
it: the rows join at different ticks (one transcribing other audio until its
conversation starts again), each with its system prompt run between ticks,
each then fed 10 s of speech.  The reference is Kyutai's ``LMGen`` loaded
from the ``tiny-stt`` checkpoint with its ``lm_gen_config``, one row alone,
fed the very 32-level codes the engine's one Mimi encode gave that row (the
tiny PersonaPlex's Mimi: the engine never runs the transcriber's own).
Every text token must be equal, every end-of-turn probability within 1e-5,
and PersonaPlex's own tokens must be those of the same run without the
transcriber.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import torch

pytest.importorskip("moshi")

import _tiny_moshi as tiny

from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import (
    END_OF_TURN_HEAD,
    END_OF_TURN_INDEX,
    ensure_tiny_stt_checkpoint,
    load_model,
    load_transcriber,
)

pytestmark = pytest.mark.oracle

FRAMES = 125  # 10 s
JOINS = (0, 9, 23)  # the tick at which each row's conversation starts its clip
OFFSETS_S = (0.0, 3.0, 6.0)
OTHER_AUDIO_S = 25.0  # what row 2 hears before its conversation starts again


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    old = os.environ.get("PPLEX_TRIO_CACHE")
    os.environ["PPLEX_TRIO_CACHE"] = str(tmp_path_factory.mktemp("pplex-cache"))
    yield
    if old is None:
        del os.environ["PPLEX_TRIO_CACHE"]
    else:
        os.environ["PPLEX_TRIO_CACHE"] = old


def run_engine(transcribe: bool, clips: np.ndarray, other: np.ndarray) -> dict[str, np.ndarray]:
    """The tiny engine over the schedule; per row and clip frame: PersonaPlex's tokens, and with ``transcribe``
    the transcriber's codes, tokens and end-of-turn probabilities."""
    stt = load_transcriber("tiny-stt") if transcribe else None
    engine = PersonaPlexEngine(load_model("tiny"), len(JOINS), transcriber=stt)
    rows = len(JOINS)
    out = {
        "tokens": np.zeros((rows, FRAMES, 17), np.int64),
        "codes": np.zeros((rows, FRAMES, 32), np.int64),
        "text": np.zeros((rows, FRAMES), np.int64),
        "end_of_turn": np.zeros((rows, FRAMES), np.float32),
    }

    def start(slot: int) -> None:
        steps = engine.start(slot, Conversation(persona="Hi.", sampling=Sampling(text_seed=slot, audio_seed=slot)))
        engine.prefill({slot: steps})

    start(2)  # row 2 hears other audio first
    for tick in range(max(JOINS) + FRAMES):
        for r, join in enumerate(JOINS):
            if tick == join:
                start(r)
        pcm = np.zeros((rows, tiny.FRAME_SIZE), np.float32)
        modes = []
        for r, join in enumerate(JOINS):
            if 0 <= tick - join < FRAMES:
                pcm[r] = clips[r, tick - join]
            elif tick < join and r == 2:
                pcm[r] = other[tick]
            modes.append(SlotMode.LIVE if tick >= join or r == 2 else SlotMode.IDLE)
        step = engine.step(modes, pcm)
        for r, join in enumerate(JOINS):
            if 0 <= tick - join < FRAMES:
                out["tokens"][r, tick - join] = engine.last_tokens[r]
                if transcribe:
                    assert step.end_of_turn is not None and engine.transcriber is not None
                    out["codes"][r, tick - join] = engine.transcriber.codes[r].numpy()
                    out["text"][r, tick - join] = engine.last_heard[r]
                    out["end_of_turn"][r, tick - join] = step.end_of_turn[r]
    return out


@torch.no_grad()
def reference(directory: pathlib.Path, codes: np.ndarray) -> dict[str, np.ndarray]:
    """moshi's LMGen alone on one row, fed ``codes`` ``[FRAMES, 32]``: its text tokens and end-of-turn."""
    from moshi.models import loaders
    from moshi.models.lm import LMGen

    config = tiny.read_config(directory)
    info = loaders.CheckpointInfo.from_hf_repo(
        "unused/unused",
        moshi_weights=directory / config["moshi_name"],
        mimi_weights=directory / config["mimi_name"],
        tokenizer=directory / config["tokenizer_name"],
        config_path=directory / "config.json",
        mimi_config_path=directory / config["mimi_config_name"],
    )
    gen = LMGen(info.get_moshi(dtype=torch.float32), **info.lm_gen_config)
    text, turn = [], []
    with gen.streaming(1):
        for frame in codes:
            result = gen.step_with_extra_heads(torch.from_numpy(frame)[None, :, None])
            assert result is not None
            tokens, heads = result
            text.append(int(tokens[0, 0, 0]))
            turn.append(float(heads[END_OF_TURN_HEAD][0, 0, END_OF_TURN_INDEX]))
    return {"text": np.array(text), "end_of_turn": np.array(turn, np.float32)}


def test_the_engines_transcriber_matches_moshi_and_leaves_personaplex_alone(cache, speech: np.ndarray) -> None:
    clips = np.stack([tiny.frames(speech[int(s * tiny.SAMPLE_RATE) :], FRAMES) for s in OFFSETS_S])
    other = tiny.frames(speech[int(OTHER_AUDIO_S * tiny.SAMPLE_RATE) :], max(JOINS))
    with tiny.one_thread():
        ours = run_engine(True, clips, other)
        alone = run_engine(False, clips, other)
        np.testing.assert_array_equal(ours["tokens"], alone["tokens"], err_msg="PersonaPlex's tokens changed")
        directory = ensure_tiny_stt_checkpoint()
        for r in range(len(JOINS)):
            ref = reference(directory, ours["codes"][r])
            mismatch = np.flatnonzero(ours["text"][r] != ref["text"])
            assert mismatch.size == 0, f"row {r}: text differs from frame {mismatch[:1]} on"
            np.testing.assert_allclose(ours["end_of_turn"][r], ref["end_of_turn"], rtol=0, atol=1e-5, err_msg=f"{r}")
    # Not a degenerate comparison: the codes vary over all 32 levels, the text varies, the probability moves.
    assert all(len(np.unique(ours["codes"][0, :, level])) > 3 for level in range(32))
    assert len(np.unique(ours["text"])) >= 5 and np.ptp(ours["end_of_turn"]) > 0.05
