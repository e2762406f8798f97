"""A real server on a loopback port, in the test's own nursery: for the few cases where the real network is the
point (most server tests use the ``virtual_server`` fixture of ``tests/conftest.py`` instead)."""

from __future__ import annotations

import functools

import pytest

from pplex_trio._cli._engines import create_engine
from pplex_trio.server import ServerSettings, serve


@pytest.fixture
def start_server(nursery, tmp_path):
    """``await start_server(engine=None, **settings)`` → a ServerHandle on a free port (its voice store in the
    test's own folder); without ``engine``, the one ``pplex-trio serve`` makes of the settings (the echo test
    engine unless ``model`` says otherwise)."""

    async def start(engine=None, **overrides):
        defaults = dict(
            host="127.0.0.1",
            port=0,
            model="echo:delay=1,prompt=2",
            slots=2,
            first_frame_timeout=0,  # (stepped from the handshake: tests of the first frame set it)
            voice_store=tmp_path / "voice-store",
        )
        defaults.update(overrides)
        settings = ServerSettings(**defaults)
        if engine is None:
            engine = create_engine(settings)
        return await nursery.start(functools.partial(serve, settings, engine))

    return start


@pytest.fixture(scope="module")
def tiny_engine():
    """The tiny model's engine with two slots, built once per test module (``engine`` gives it fresh)."""
    from pplex_trio.engine import PersonaPlexEngine

    return PersonaPlexEngine.load("tiny", num_slots=2)


@pytest.fixture
def engine(tiny_engine):
    tiny_engine.reset_all()
    return tiny_engine
