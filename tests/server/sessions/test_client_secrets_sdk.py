"""A client secret as OpenAI's browser flow uses one: the official ``openai`` SDK mints it with the server's token
(``client.realtime.client_secrets.create``), then a page opens ``/v1/realtime`` with it as its key, the way a
browser gives one (the ``openai-insecure-api-key.<secret>`` subprotocol); real sockets, the echo engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from _helpers.browser import ThreadServer
from pplex_trio.engine import EchoEngine
from pplex_trio.server import ServerSettings

openai = pytest.importorskip("openai")
from openai.types.realtime import ClientSecretCreateResponse, RealtimeServerEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402
from websockets.exceptions import InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

TOKEN = "sdk-token-3b8e0d6f1a9c"
PERSONA = "You are a lighthouse keeper."


@pytest.fixture
def running() -> Iterator[ThreadServer]:
    settings = ServerSettings(host="127.0.0.1", port=0, slots=1, auth_token=TOKEN)
    server = ThreadServer(settings, EchoEngine(1, delay_frames=1, prefill_steps=4)).start()
    yield server
    server.stop()


def browser_call(server: ThreadServer, secret: str) -> Any:
    """What a page's ``new WebSocket(url, ["realtime", "openai-insecure-api-key." + secret])`` sends."""
    return connect(
        server.url.replace("http", "ws", 1) + "/v1/realtime?model=personaplex",
        subprotocols=["realtime", f"openai-insecure-api-key.{secret}"],
        open_timeout=10,
    )


def test_the_sdk_mints_a_secret_a_browser_uses_once(running):
    client = openai.OpenAI(api_key=TOKEN, base_url=running.url + "/v1")
    try:
        minted = client.realtime.client_secrets.create(
            expires_after={"anchor": "created_at", "seconds": 60},
            session={"type": "realtime", "instructions": PERSONA, "audio": {"output": {"voice": "NATF2.pt"}}},
        )
        assert isinstance(minted, ClientSecretCreateResponse)  # (the SDK parsed our answer into its type)
        assert minted.value.startswith("ek_") and minted.session.instructions == PERSONA

        with browser_call(running, minted.value) as ws:
            assert ws.subprotocol == "realtime"
            created = json.loads(ws.recv(timeout=10))
            TypeAdapter(RealtimeServerEvent).validate_python(created)
            assert created["type"] == "session.created"
            assert created["session"]["instructions"] == PERSONA
            assert created["session"]["audio"]["output"]["voice"] == "NATF2.pt"

        with pytest.raises(InvalidStatus) as again, browser_call(running, minted.value):
            pass
        assert again.value.response.status_code == 401
        assert b"used already" in again.value.response.body

        # The secret is no key to the rest of the API: the SDK given it as its key cannot mint another.
        holder = openai.OpenAI(api_key=minted.value, base_url=running.url + "/v1")
        with pytest.raises(openai.AuthenticationError), holder:
            holder.realtime.client_secrets.create()
    finally:
        client.close()
