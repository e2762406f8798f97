"""Our streaming Mimi against moshi 0.2.13's, on the same tiny weights and real speech.

Codes must be exactly equal; decoded audio within 1e-5.  The runs are longer
than the tiny Mimi context (40 transformer steps = 20 frames), so the
attention rings wrap.  moshi follows the checkpoint's reference: unpatched
for Kyutai's checkpoint, the fork's window for the PersonaPlex-style one.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

pytest.importorskip("moshi")

import _moshi_ref as ref  # noqa: E402
import _ours  # noqa: E402
import _tiny_moshi as tiny  # noqa: E402

pytestmark = pytest.mark.oracle

FRAMES = 60
# Row 2 restarts at frame 25; row 3 is paused (exec mask off) for frames 10-14.
RESETS = {25: [2]}
PAUSES = {t: [True, True, True, False] for t in range(10, 15)}


@pytest.fixture(scope="module")
def ours(checkpoint: pathlib.Path):
    return _ours.load(checkpoint)


@pytest.fixture(scope="module")
def moshi_mimi(checkpoint: pathlib.Path):
    return tiny.load_moshi_mimi(checkpoint)


def executed(batch: int, steps: int, exec_masks: dict[int, list[bool]]) -> np.ndarray:
    """``[B, T]``: which (row, step) actually ran."""
    ran = np.ones((batch, steps), dtype=bool)
    for t, mask in exec_masks.items():
        ran[:, t] = mask
    return ran


def test_wraps_the_attention_ring(checkpoint: pathlib.Path) -> None:
    """The comparisons below are only meaningful past the ring's capacity."""
    assert 2 * FRAMES > tiny.read_config(checkpoint)["mimi"]["transformer"]["context"] + 10


def test_streaming_encode_equals_moshi(ours, moshi_mimi, checkpoint: pathlib.Path, speech_rows: np.ndarray) -> None:
    pcm = speech_rows[:1, :FRAMES]
    rule = ref.checkpoint_semantics(checkpoint).window
    assert ours.config.mimi.transformer.reference == ("kyutai" if rule == "kyutai" else "personaplex")
    expected = ref.mimi_encode(moshi_mimi, pcm, rule=rule)
    np.testing.assert_array_equal(_ours.mimi_encode(ours, pcm), expected)


def test_streaming_decode_equals_moshi(ours, moshi_mimi, checkpoint: pathlib.Path, user_codes) -> None:
    codes = user_codes[checkpoint.name][:1, :FRAMES]
    expected = ref.mimi_decode(moshi_mimi, codes, rule=ref.checkpoint_semantics(checkpoint).window)
    got = _ours.mimi_decode(ours, codes)
    assert np.abs(expected).max() > 0.05  # real audio, not silence
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_batch_with_reset_and_pause_equals_moshi_and_single_rows(
    ours, moshi_mimi, checkpoint: pathlib.Path, speech_rows: np.ndarray, user_codes
) -> None:
    """B=4 with one row restarted and one paused: equal to moshi, and each row to its own B=1 stream.

    The other rows must not notice (bit for bit, against the same batch run
    without the events).  A restarted row must equal a fresh stream fed from
    the restart on, a paused row one that never saw the paused frames: codes
    exactly, audio up to float rounding (a B=1 matmul may round differently
    from a B=4 one).
    """
    rule = ref.checkpoint_semantics(checkpoint).window
    pcm = speech_rows[:, :FRAMES]
    codes = user_codes[checkpoint.name][:, :FRAMES]
    ran = executed(4, FRAMES, PAUSES)

    enc = _ours.mimi_encode(ours, pcm, RESETS, PAUSES)
    dec = _ours.mimi_decode(ours, codes, RESETS, PAUSES)
    np.testing.assert_array_equal(enc[ran], ref.mimi_encode(moshi_mimi, pcm, RESETS, PAUSES, rule=rule)[ran])
    np.testing.assert_allclose(
        dec[ran], ref.mimi_decode(moshi_mimi, codes, RESETS, PAUSES, rule=rule)[ran], rtol=0, atol=1e-5
    )

    plain_enc, plain_dec = _ours.mimi_encode(ours, pcm), _ours.mimi_decode(ours, codes)
    k = next(iter(RESETS))
    for row, upto in ((0, FRAMES), (1, FRAMES), (2, k), (3, min(PAUSES))):
        np.testing.assert_array_equal(enc[row, :upto], plain_enc[row, :upto])
        np.testing.assert_array_equal(dec[row, :upto], plain_dec[row, :upto])

    def alone(row: int, frames: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        return (
            _ours.mimi_encode(ours, pcm[row : row + 1, frames])[0],
            _ours.mimi_decode(ours, codes[row : row + 1, frames])[0],
        )

    for row, frames in ((0, slice(None)), (2, slice(k, None)), (3, ran[3])):
        alone_enc, alone_dec = alone(row, frames)
        np.testing.assert_array_equal(enc[row, frames], alone_enc)
        np.testing.assert_allclose(dec[row, frames], alone_dec, rtol=0, atol=1e-6)


def test_the_window_rule_matters(ours, moshi_mimi, checkpoint: pathlib.Path, speech_rows: np.ndarray) -> None:
    """moshi with the other reference's window gives other codes once the ring wraps (~frame 20 here)."""
    rule = ref.checkpoint_semantics(checkpoint).window
    other = {"fork": "kyutai", "kyutai": "fork"}[rule]
    pcm = speech_rows[:1, :FRAMES]
    assert not np.array_equal(_ours.mimi_encode(ours, pcm), ref.mimi_encode(moshi_mimi, pcm, rule=other))
