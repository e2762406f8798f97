"""``POST /v1/realtime/client_secrets`` and the secrets it mints, through the real server (virtual network and clock).

The SDK's own call against a real socket is ``tests/server/sessions/test_client_secrets_sdk.py``.
"""

from __future__ import annotations

import json
import logging

import pytest
import trio

from _helpers.bad_client import Refused

TOKEN = "tok-5d1e9b7c3a0f2468ace1"
BEARER = {"authorization": f"Bearer {TOKEN}"}
PERSONA = "You are a lighthouse keeper."
SESSION = {"type": "realtime", "instructions": PERSONA, "audio": {"output": {"voice": "NATF1.pt"}}}


async def mint(handle, body=None, headers=BEARER):
    async with handle.http() as http:
        return await http.post("/v1/realtime/client_secrets", json=body or {}, headers=headers)


async def upgrade(handle, path: str, secret: str):
    """Open ``path`` with ``secret`` as a browser's Realtime client gives its key: a subprotocol."""
    return await handle.bad_client(path, headers=[("Sec-WebSocket-Protocol", f"openai-insecure-api-key.{secret}")])


async def refusal(handle, path: str, secret: str) -> Refused:
    with pytest.raises(Refused) as refused:
        await upgrade(handle, path, secret)
    return refused.value


async def test_minting_needs_the_token_and_answers_the_sdks_shape(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    assert (await mint(handle, headers={})).status_code == 401
    before = trio.current_time()
    response = await mint(handle, {"expires_after": {"anchor": "created_at", "seconds": 120}, "session": SESSION})
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["value"].startswith("ek_") and TOKEN not in body["value"]
    assert body["expires_at"] >= int(before) + 120 - 1 and isinstance(body["expires_at"], int)
    session = body["session"]
    assert session["type"] == "realtime" and session["instructions"] == PERSONA
    assert session["audio"]["output"]["voice"] == "NATF1.pt"
    default = (await mint(handle)).json()
    assert default["session"]["instructions"] == "" and default["value"] != body["value"]


async def test_a_bad_session_is_a_400_that_says_why(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    bad = await mint(handle, {"session": {"type": "realtime", "audio": {"output": {"voice": "nobody.pt"}}}})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "session.audio.output.voice"
    assert "nobody.pt" in error["message"]
    short = (await mint(handle, {"expires_after": {"seconds": 5}})).json()["error"]
    assert short["param"] == "expires_after.seconds" and "10" in short["message"]
    # The caller's words on a server that transcribes nothing: told now, not once the call has opened.
    words = {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}
    unheard = (await mint(handle, {"session": words})).json()["error"]
    assert unheard["code"] == "transcription_unavailable" and "--transcribe" in unheard["message"]
    async with handle.http() as http:
        garbage = await http.post("/v1/realtime/client_secrets", content=b"{nope", headers=BEARER)
    assert garbage.status_code == 400 and "JSON" in garbage.json()["error"]["message"]


async def test_a_secret_opens_one_call_that_starts_with_its_settings(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    secret = (await mint(handle, {"session": SESSION})).json()["value"]
    client = await upgrade(handle, "/v1/realtime", secret)
    created = json.loads(await client.receive())
    assert created["type"] == "session.created"
    assert created["session"]["instructions"] == PERSONA
    assert created["session"]["audio"]["output"]["voice"] == "NATF1.pt"
    again = await refusal(handle, "/v1/realtime", secret)
    assert again.status == 401 and "used already" in json.loads(again.body)["error"]
    client.close()
    # A plain call (the token) starts with the server's defaults, as before.
    plain = await handle.bad_client("/v1/realtime", headers=[("Authorization", f"Bearer {TOKEN}")])
    assert json.loads(await plain.receive())["session"]["instructions"] == ""
    plain.close()


async def test_a_secret_expires_at_its_time(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN, client_secret_seconds=30)
    early, late = [(await mint(handle)).json()["value"] for _ in range(2)]
    await trio.sleep(29.5)
    (await upgrade(handle, "/v1/realtime", early)).close()
    await trio.sleep(0.5)
    expired = await refusal(handle, "/v1/realtime", late)
    assert expired.status == 401 and "expired" in json.loads(expired.body)["error"]


async def test_a_secret_opens_nothing_else(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    secret = (await mint(handle)).json()["value"]
    for path in ("/v1/audio/duplex", "/api/chat", "/v1/live/sessions"):
        refused = await refusal(handle, path, secret)
        assert refused.status == 401 and "opens one Realtime call" in refused.body, path
    more = await mint(handle, headers={"authorization": f"Bearer {secret}"})  # a secret cannot mint more
    assert more.status_code == 401
    async with handle.http() as http:
        assert (await http.get("/api/info", params={"token": secret})).status_code == 401
    (await upgrade(handle, "/v1/realtime", secret)).close()  # (none of those spent it)


async def test_unknown_secrets_are_refused_even_without_a_token(virtual_server, autojump_clock):
    handle = await virtual_server()  # an open server mints too; a secret still opens one call
    secret = (await mint(handle, {"session": SESSION}, headers={})).json()["value"]
    client = await upgrade(handle, "/v1/realtime", secret)
    assert json.loads(await client.receive())["session"]["instructions"] == PERSONA
    client.close()
    assert (await refusal(handle, "/v1/realtime", secret)).status == 401
    assert (await refusal(handle, "/v1/realtime", "ek_made_up")).status == 401


async def test_a_flood_of_mints_is_capped(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN, client_secret_seconds=10)
    handle.server.client_secrets.cap = 3
    for _ in range(3):
        assert (await mint(handle)).status_code == 200
    flooded = await mint(handle)
    assert flooded.status_code == 429 and flooded.json()["error"]["type"] == "rate_limit_error"
    await trio.sleep(10)  # they expire: room again
    assert (await mint(handle)).status_code == 200
    assert len(handle.server.client_secrets) == 1


@pytest.mark.parametrize("access_log", [False, True])
async def test_secrets_never_reach_the_logs(virtual_server, autojump_clock, caplog, access_log):
    caplog.set_level(logging.DEBUG)
    handle = await virtual_server(auth_token=TOKEN, access_log=access_log)
    secrets = [(await mint(handle)).json()["value"] for _ in range(3)]
    (await upgrade(handle, "/v1/realtime", secrets[0])).close()
    (await handle.bad_client(f"/v1/realtime?token={secrets[1]}")).close()
    (await handle.bad_client("/v1/realtime", headers=[("Authorization", f"Bearer {secrets[2]}")])).close()
    for secret in secrets:
        await refusal(handle, "/v1/realtime", secret)
    await trio.sleep(1)
    logged = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith(("httpx", "httpcore")))
    assert "minted a client secret" in logged
    assert TOKEN not in logged and not any(secret in logged for secret in secrets)
    assert "ek_" not in logged
