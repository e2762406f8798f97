"""A real server on a loopback port, in the test's own nursery."""

from __future__ import annotations

import functools

import pytest

from pplex_trio._cli._engines import create_engine
from pplex_trio.server import ServerSettings, serve


@pytest.fixture
def start_server(nursery, tmp_path):
    """``await start_server(engine=None, voice_limits=None, **settings)`` → a ServerHandle on a free port (its voice
    store in the test's own folder); without ``engine``, the one ``pplex-trio serve`` makes of the settings (the
    echo test engine unless ``model`` says otherwise)."""

    async def start(engine=None, voice_limits=None, **overrides):
        defaults = dict(host="127.0.0.1", port=0, model="echo:delay=1,prompt=2", slots=2,
                        voice_store=tmp_path / "voice-store")
        defaults.update(overrides)
        settings = ServerSettings(**defaults)
        if engine is None:
            engine = create_engine(settings)
        return await nursery.start(functools.partial(serve, settings, engine, voice_limits=voice_limits))

    return start
