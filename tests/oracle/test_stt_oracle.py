"""Our streaming speech-to-text against moshi 0.2.13's, on the tiny STT checkpoint and real speech.

The checkpoint is the one ``pplex_trio`` builds (``tiny-stt``, Kyutai's
layout); moshi loads it with its own ``CheckpointInfo`` and runs it the way
Kyutai runs its STT models: ``LMGen`` configured from the checkpoint's
``lm_gen_config`` (temperature 0: greedy), fp32 on the CPU, its own Mimi
encoding the audio at 32 levels, ``step_with_extra_heads``.  Each reference
row runs alone; ours runs three rows batched that join at different ticks
(one idle until it joins, one transcribing other audio until it is reset),
over 10 s of speech: far past the tiny LM's 24-frame ring and Mimi's
40-step one, so both wrap.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

pytest.importorskip("moshi")

import _tiny_moshi as tiny

from pplex_trio.model import (
    END_OF_TURN_HEAD,
    END_OF_TURN_INDEX,
    Transcriber,
    ensure_tiny_stt_checkpoint,
    load_transcriber,
)

pytestmark = pytest.mark.oracle

FRAMES = 125  # 10 s
JOINS = (0, 9, 23)  # the tick at which each row starts its clip
OFFSETS_S = (0.0, 3.0, 6.0)  # where in the speech each row's clip starts
OTHER_AUDIO_S = 25.0  # what row 2 transcribes before it is reset


@pytest.fixture(scope="module")
def stt_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return ensure_tiny_stt_checkpoint(tmp_path_factory.mktemp("tiny-stt"))


@pytest.fixture(scope="module")
def clips(speech: np.ndarray) -> np.ndarray:
    """``[rows, FRAMES, 1920]``: each row's 10 s of speech."""
    return np.stack([tiny.frames(speech[int(s * tiny.SAMPLE_RATE) :], FRAMES) for s in OFFSETS_S])


@torch.no_grad()
def reference(directory: pathlib.Path, clip: np.ndarray) -> dict[str, np.ndarray]:
    """moshi alone on one row: its Mimi codes, text tokens and extra heads' probabilities per frame."""
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
    assert info.model_type == "stt" and info.stt_config["audio_delay_seconds"] == 0.5
    mimi = info.get_mimi()
    lm = info.get_moshi(dtype=torch.float32)
    gen = LMGen(lm, **info.lm_gen_config)
    codes, text, heads = [], [], []
    with mimi.streaming(1), gen.streaming(1):
        for frame in clip:
            c = mimi.encode(torch.from_numpy(frame)[None, None])
            out = gen.step_with_extra_heads(c)
            assert out is not None
            tokens, extra = out
            codes.append(c[0, :, 0].numpy())
            text.append(int(tokens[0, 0, 0]))
            heads.append(torch.stack([h[0, 0] for h in extra]).numpy())
    return {"codes": np.stack(codes), "text": np.array(text), "heads": np.stack(heads)}


@torch.no_grad()
def ours_batched(directory: pathlib.Path, clips: np.ndarray, other: np.ndarray) -> dict[str, np.ndarray]:
    """Our Mimi (one 32-level encode) and :class:`Transcriber`, the rows batched and joining at ``JOINS``."""
    loaded = load_transcriber(str(directory))
    rows = len(JOINS)
    mimi, transcriber = loaded.mimi, Transcriber(loaded.model, rows)
    encoder = mimi.init_encoder_state(rows)
    codes = np.zeros((rows, FRAMES, 32), dtype=np.int64)
    text = np.zeros((rows, FRAMES), dtype=np.int64)
    heads = np.zeros((rows, FRAMES, 4, 6), dtype=np.float32)
    eot = np.zeros((rows, FRAMES), dtype=np.float32)
    for tick in range(max(JOINS) + FRAMES):
        joining = torch.tensor([tick == j for j in JOINS])
        if joining.any():
            encoder.reset(joining)
            transcriber.reset(joining)
        pcm = np.zeros((rows, tiny.FRAME_SIZE), dtype=np.float32)
        exec_mask = []
        for r, join in enumerate(JOINS):
            if 0 <= tick - join < FRAMES:
                pcm[r] = clips[r, tick - join]
            elif tick < join and r == 2:
                pcm[r] = other[tick]
            exec_mask.append(tick >= join or r == 2)
        mask = torch.tensor(exec_mask)
        c = mimi.encode_frame(torch.from_numpy(pcm), encoder, mask, num_codebooks=32)
        step = transcriber.step(c, mask)
        assert step.end_of_turn is not None
        for r, join in enumerate(JOINS):
            if 0 <= tick - join < FRAMES:
                assert bool(step.valid[r])
                codes[r, tick - join] = c[r].numpy()
                text[r, tick - join] = int(step.text[r])
                heads[r, tick - join] = step.extra_heads[r].numpy()
                eot[r, tick - join] = float(step.end_of_turn[r])
    return {"codes": codes, "text": text, "heads": heads, "end_of_turn": eot}


def test_transcriber_matches_moshi_token_for_token(
    stt_dir: pathlib.Path, clips: np.ndarray, speech: np.ndarray
) -> None:
    other = tiny.frames(speech[int(OTHER_AUDIO_S * tiny.SAMPLE_RATE) :], max(JOINS))
    ours = ours_batched(stt_dir, clips, other)
    for r in range(len(JOINS)):
        ref = reference(stt_dir, clips[r])
        np.testing.assert_array_equal(ours["codes"][r], ref["codes"], err_msg=f"row {r}: Mimi codes")
        mismatch = np.flatnonzero(ours["text"][r] != ref["text"])
        assert mismatch.size == 0, f"row {r}: text differs from frame {mismatch[:1]} on"
        np.testing.assert_allclose(ours["heads"][r], ref["heads"], rtol=0, atol=1e-5, err_msg=f"row {r}")
        np.testing.assert_allclose(
            ours["end_of_turn"][r], ref["heads"][:, END_OF_TURN_HEAD, END_OF_TURN_INDEX], rtol=0, atol=1e-5
        )
    # Not a degenerate comparison: the text varies, the end-of-turn probability moves.
    assert len(np.unique(ours["text"])) >= 5, np.unique(ours["text"])
    assert np.ptp(ours["end_of_turn"]) > 0.05
