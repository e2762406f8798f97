"""The oracle itself: tiny checkpoints are sound and the fork-window emulation is right.

If one of these fails, every comparison in this folder is suspect, whatever
our implementation does.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

pytest.importorskip("moshi")

import _moshi_ref as ref  # noqa: E402
import _tiny_moshi as tiny  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402

pytestmark = pytest.mark.oracle


def _keys(path: pathlib.Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def test_tiny_checkpoint_has_the_golden_layout(
    tiny_checkpoints: dict[str, pathlib.Path], golden_dir: pathlib.Path
) -> None:
    """The dep_q 16 checkpoint holds exactly the golden set's tensor names, Kyutai's holds the dep_q 8 subset."""
    for name in (tiny.MOSHI_NAME, tiny.MIMI_NAME):
        golden = set(_keys(golden_dir / name))
        assert set(_keys(tiny_checkpoints["personaplex-dep16"] / name)) == golden
    kyutai = set(_keys(tiny_checkpoints["kyutai-dep8"] / tiny.MOSHI_NAME))
    golden_lm = set(_keys(golden_dir / tiny.MOSHI_NAME))
    # Kyutai's has the same names minus depformer steps 8-15 (its fused attention weights are just shorter).
    steps_8_to_15 = {f"{p}.{s}.weight" for s in range(8, 16) for p in ("depformer_in", "linears")}
    steps_8_to_15 |= {f"depformer_emb.{s - 1}.weight" for s in range(8, 16)}
    steps_8_to_15 |= {
        f"depformer.layers.{j}.gating.{s}.linear_{io}.weight"
        for j in range(2)
        for s in range(8, 16)
        for io in ("in", "out")
    }
    assert golden_lm - kyutai == steps_8_to_15
    assert kyutai <= golden_lm


def test_moshi_reloads_the_checkpoint_bit_for_bit(
    tiny_checkpoints: dict[str, pathlib.Path], speech: np.ndarray
) -> None:
    """Saving then loading through moshi's strict loaders gives back the very modules that were built."""
    for name, directory in tiny_checkpoints.items():
        spec = tiny.SPECS[name]
        for built, loaded in (
            (tiny.build_lm(spec), tiny.load_moshi_lm(directory)),
            (tiny.build_mimi(spec, speech), tiny.load_moshi_mimi(directory)),
        ):
            a, b = built.state_dict(), loaded.state_dict()
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(a[key], b[key]), f"{name}: {key} changed through save/load"


def test_tokenizer_ids_match_the_golden_convention(tiny_checkpoints: dict[str, pathlib.Path]) -> None:
    import sentencepiece as spm

    for directory in tiny_checkpoints.values():
        sp = spm.SentencePieceProcessor(model_file=str(directory / tiny.TOKENIZER_NAME))
        assert sp.vocab_size() == tiny.read_config(directory)["text_card"]
        assert [sp.id_to_piece(i) for i in range(4)] == ["<unk>", "<s>", "</s>", "<pad>"]


def test_codes_and_audio_are_not_degenerate(
    tiny_checkpoints: dict[str, pathlib.Path], user_codes: dict[str, np.ndarray]
) -> None:
    """Random codebooks would give all-zero codes; ours must use many entries of every codebook."""
    for name, codes in user_codes.items():
        card = tiny.read_config(tiny_checkpoints[name])["card"]
        assert codes.min() >= 0 and codes.max() < card
        distinct = [len(np.unique(codes[:, :, k])) for k in range(codes.shape[-1])]
        assert min(distinct) >= card // 4, f"{name}: codebooks use too few entries: {distinct}"
        pcm = ref.mimi_decode(tiny.load_moshi_mimi(tiny_checkpoints[name]), codes[:1, :30])
        assert 0.01 < float(np.sqrt(np.mean(pcm**2))) and float(np.abs(pcm).max()) < 1.0


def test_fork_window_reproduces_golden_mimi(golden_dir: pathlib.Path) -> None:
    """moshi 0.2.13 + the fork's window rule equals NVIDIA's fork on the golden set; the plain rule does not.

    This pins both what :func:`_moshi_ref.attention_window` emulates and the
    disagreement between the two references in Mimi (its context is 50 steps
    there, so it shows up from frame 24 on).
    """
    mimi = tiny.load_moshi_mimi(golden_dir)
    pcm = tiny.frames(tiny.load_speech(golden_dir / "input.wav"), 100)[None]
    expected_codes = np.load(golden_dir / "expected" / "input_codes.npy")
    np.testing.assert_array_equal(ref.mimi_encode(mimi, pcm, rule="fork")[0], expected_codes)
    plain = ref.mimi_encode(mimi, pcm, rule="kyutai")[0]
    assert (plain != expected_codes).any(axis=1).sum() > 0

    tokens = np.load(golden_dir / "expected" / "output_tokens.npy")[:, 1:9][None]
    expected_pcm = np.load(golden_dir / "expected" / "output_pcm.npy").reshape(1, 100, -1)
    np.testing.assert_allclose(ref.mimi_decode(mimi, tokens, rule="fork"), expected_pcm, rtol=0, atol=1e-5)
    plain_pcm = ref.mimi_decode(mimi, tokens, rule="kyutai")
    np.testing.assert_allclose(plain_pcm[:, :24], expected_pcm[:, :24], rtol=0, atol=1e-5)
    assert np.abs(plain_pcm - expected_pcm).max() > 1e-3


def test_truncated_depformer_is_an_exact_oracle(
    tiny_checkpoints: dict[str, pathlib.Path], user_codes: dict[str, np.ndarray]
) -> None:
    """Depformer steps 8-15 never change text or agent audio: PersonaPlex's dep_q 16 == its first 8 steps.

    moshi 0.2.13 cannot teacher-force steps 8-15, so we check the claim inside
    one moshi dep_q 16 LM: run its depformer for 8 steps as dep_q 8 would, and
    compare with a dep_q 8 LM loaded from the truncated weights.
    """
    directory = tiny_checkpoints["personaplex-dep16"]
    full = tiny.load_moshi_lm(directory)
    small = ref.load_oracle_lm(directory)
    torch.manual_seed(0)
    with torch.no_grad():
        x = torch.randn(3, 1, full.dim)
        text = torch.randint(0, full.text_card, (3, 1, 1))
        logits_full, logits_small = [], []
        for lm, sink in ((full, logits_full), (small, logits_small)):
            with lm.depformer.streaming(3):
                prev = text
                for step in range(8):
                    logits = lm.forward_depformer(step, prev, x)
                    sink.append(logits)
                    prev = logits.argmax(-1)
    # Equal up to float32 rounding: the two LMs hold their per-step weights in
    # matrices of different sizes, and on some CPUs the BLAS blocks those
    # products differently (seen here: 3.6e-7).  A real dependence on steps
    # 8-15 would move the logits by orders of magnitude more.
    for a, b in zip(logits_full, logits_small, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
