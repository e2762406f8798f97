"""Fixtures shared by every test folder."""

from __future__ import annotations

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# Real speech and golden data live beside the checkout, on every developer
# machine and in CI (see the developers' guide); tests never copy them in.
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    if not SHARED.is_dir():
        pytest.fail(f"shared data folder not found at {SHARED}: check out the project beside ../shared")
    return SHARED


@pytest.fixture(scope="session")
def golden_dir(shared_dir: pathlib.Path) -> pathlib.Path:
    return shared_dir / "golden" / "tiny-public"


@pytest.fixture(scope="session")
def speech_wav(shared_dir: pathlib.Path) -> pathlib.Path:
    return shared_dir / "data" / "speech_assistant.wav"
