"""Session fixtures of the moshi-oracle suite: tiny checkpoints and real speech.

Every test module here starts with ``pytest.importorskip("moshi")``; these
fixtures import moshi only when a test asks for them, so collecting this folder
without moshi installed skips cleanly.
"""

from __future__ import annotations

import os
import pathlib
import typing as tp

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # before anything imports moshi

import _tiny_moshi as tiny  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _tiny_moshi import BATCH, LM_STEPS, ROW_OFFSET_S  # noqa: E402


@pytest.fixture(scope="session")
def speech(speech_wav: pathlib.Path) -> np.ndarray:
    """The 40 s speech file, mono float32 at 24 kHz."""
    return tiny.load_speech(speech_wav)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory, speech: np.ndarray) -> dict[str, pathlib.Path]:
    """Both tiny checkpoints (Kyutai dep_q 8, PersonaPlex-style dep_q 16), built once."""
    pytest.importorskip("moshi")
    root = tmp_path_factory.mktemp("tiny-moshi")
    return {name: tiny.make_checkpoint(root / name, spec, speech) for name, spec in tiny.SPECS.items()}


@pytest.fixture(scope="session", params=sorted(tiny.SPECS))
def checkpoint(request: pytest.FixtureRequest, tiny_checkpoints: dict[str, pathlib.Path]) -> pathlib.Path:
    """Each tiny checkpoint in turn."""
    return tiny_checkpoints[request.param]


@pytest.fixture(scope="session")
def speech_rows(speech: np.ndarray) -> np.ndarray:
    """``[BATCH, LM_STEPS, 1920]``: row r is the speech from ``r * ROW_OFFSET_S`` on."""
    start = int(ROW_OFFSET_S * tiny.SAMPLE_RATE)
    return np.stack([tiny.frames(speech[r * start :], LM_STEPS) for r in range(BATCH)])


@pytest.fixture(scope="session")
def user_codes(tiny_checkpoints: dict[str, pathlib.Path], speech_rows: np.ndarray) -> dict[str, np.ndarray]:
    """Per checkpoint, moshi's streaming Mimi codes of :func:`speech_rows`: ``[BATCH, LM_STEPS, 8]``.

    These are the user audio the LM runs listen to (encoded with the fork's
    window for both checkpoints: any real codes would do).
    """
    import _moshi_ref as ref

    with tiny.one_thread():
        return {
            name: ref.mimi_encode(tiny.load_moshi_mimi(directory), speech_rows, rule="fork")
            for name, directory in tiny_checkpoints.items()
        }


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> tp.Iterator[None]:
    """Tiny models gain nothing from threads, and on a shared 2-core machine they stall.

    Both implementations run under the same setting, so this changes no comparison.
    """
    with tiny.one_thread():
        yield
