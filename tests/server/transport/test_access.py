"""The door of the server: the token, origins, connections per address, the session time limit.

The real server on the virtual network and clock; our own command-line client is
tested against it too, its connections routed onto the virtual network.
"""

from __future__ import annotations

import json
import logging
import re

import pytest
import trio

from _helpers.bad_client import Refused
from _helpers.ws import errors_in, moshi_handshake, read_until_closed
from pplex_trio.client import Refused as ClientRefused
from pplex_trio.client import open_websocket
from pplex_trio.server import create_app
from pplex_trio.server._serve import OPEN_PATHS

TOKEN = "tok-7f3a9c1e5b2d4f6a8c0e"
WS_PATHS = {"moshi": "/api/chat?voice_prompt=NATF0.pt", "raw": "/v1/audio/duplex"}
COOKIE = "pplex_trio_auth"
CLIENT_LOGGERS = ("httpx", "httpcore", "trio-websocket")  # the test's own clients log the URLs they open


def protected_routes(handle) -> tuple[list[str], list[str]]:
    """Every route of the app (HTTP paths, WebSocket paths) but the probes' (OPEN_PATHS), read from its URL map."""
    app = create_app(handle.server)
    http, websockets = [], sorted(app.websocket_paths)  # the conversation routes, served beside Quart
    for rule in app.app.url_map.iter_rules():
        path = re.sub(r"<path:\w+>", "index.html", rule.rule)
        if path in OPEN_PATHS:
            continue
        (websockets if rule.websocket else http).append(path)
    return http, websockets


async def status_of_upgrade(handle, path: str, headers: list[tuple[str, str]] | None = None) -> int:
    """101 when the upgrade is accepted, else the refusal's status."""
    try:
        client = await handle.bad_client(path, headers=headers)
    except Refused as refused:
        return refused.status
    client.close()
    return 101


async def test_every_route_but_the_probes_needs_the_token(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    http_paths, ws_paths = protected_routes(handle)
    assert {"/", "/metrics", "/api/info", "/api/sessions", "/api/voices", "/api/queue", "/v1/models"} <= set(http_paths)
    carriers = ["/telephony/exotel", "/telephony/plivo", "/telephony/telnyx", "/telephony/twilio"]
    assert sorted(ws_paths) == [
        "/api/chat",
        "/live/sessions",
        *carriers,
        "/v1/audio/duplex",
        "/v1/live/sessions",
        "/v1/realtime",
    ]
    # A phone carrier's stream cannot always carry the token in its URL: its session checks the one in its start
    # event's parameters or its URL's query (tests/server/sessions/test_twilio.py, test_carriers.py); the gate lets the
    # upgrade through.
    for path in carriers:
        ws_paths.remove(path)
        assert await status_of_upgrade(handle, path) == 101
    wrong_ways = [
        {},
        {"headers": {"authorization": "Bearer wrong"}},
        {"params": {"token": "wrong"}},
        {"headers": {"authorization": f"Basic {TOKEN}"}},
        {"headers": {"cookie": f"{COOKIE}={TOKEN}"}},
    ]
    async with handle.http() as http:
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/ready")).status_code == 200
        assert OPEN_PATHS == {"/health", "/ready"}
        for path in http_paths:
            for way in wrong_ways:
                http.cookies.clear()
                response = await http.get(path, **way)
                assert response.status_code == 401, (path, way)
                assert response.headers["www-authenticate"].startswith("Bearer")
                assert TOKEN not in response.text
            http.cookies.clear()
            ok = await http.get(path, headers={"authorization": f"Bearer {TOKEN}"}, params={"ticket": "t"})
            assert ok.status_code != 401, path
    for path in ws_paths:
        assert await status_of_upgrade(handle, path) == 401
        assert await status_of_upgrade(handle, path, [("Authorization", "Bearer nope")]) == 401
        assert await status_of_upgrade(handle, path + "?token=nope") == 401
        assert await status_of_upgrade(handle, path, [("Authorization", f"Bearer {TOKEN}")]) == 101
        assert await status_of_upgrade(handle, f"{path}?token={TOKEN}") == 101


async def test_a_refused_upgrade_says_why_and_never_reaches_a_session(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    with pytest.raises(Refused) as refused:
        await handle.bad_client(WS_PATHS["moshi"])
    assert refused.value.status == 401 and "token" in json.loads(refused.value.body)["error"]
    metrics = handle.server.metrics.render().decode()
    assert 'pplex_refused_total{reason="unauthorized"} 1.0' in metrics
    assert "pplex_sessions_started_total" not in metrics.replace("# HELP pplex_sessions_started_total", "").replace(
        "# TYPE pplex_sessions_started_total", ""
    )


async def test_our_client_sends_the_token_and_reports_a_refusal(virtual_server, autojump_clock, monkeypatch):
    handle = await virtual_server(auth_token=TOKEN)
    monkeypatch.setattr(trio, "open_tcp_stream", handle.open_tcp_stream)  # the client's connections: virtual
    url = handle.ws_url + WS_PATHS["moshi"]
    with pytest.raises(ClientRefused, match=r"\(401\).*token"):
        async with open_websocket(url):
            pass
    async with open_websocket(url, token=TOKEN) as ws:
        await moshi_handshake(ws)


async def test_the_cookie_from_a_page_opened_with_the_token(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    async with handle.http() as http:
        response = await http.get("/", params={"official": "", "token": TOKEN})
        assert response.status_code == 303
        assert response.headers["location"] == "/?official="  # the token leaves the address bar
        cookie = response.headers["set-cookie"]
        attributes = [part.strip() for part in cookie.split(";")]
        assert attributes[0].startswith(f"{COOKIE}=") and TOKEN not in cookie
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(attributes) and "Secure" not in attributes
        assert response.headers["referrer-policy"] == "no-referrer"
        assert (await http.get("/api/info")).status_code == 200  # httpx keeps the cookie, as a browser does
        assert (await http.get("/")).status_code == 200
        value = attributes[0].split("=", 1)[1]
    headers = [("Cookie", f"{COOKIE}={value}")]
    assert await status_of_upgrade(handle, WS_PATHS["moshi"], headers) == 101
    assert await status_of_upgrade(handle, WS_PATHS["raw"], headers) == 101


async def test_a_page_without_the_token_asks_for_it(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    async with handle.http() as http:
        page = await http.get("/", params={"official": ""}, headers={"accept": "text/html"})
        assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
        assert '<input name="token" type="password"' in page.text
        assert '<input type="hidden" name="official" value="">' in page.text
        assert "not the right one" not in page.text
        wrong = await http.get("/", params={"token": "guess"}, headers={"accept": "text/html"})
        assert wrong.status_code == 401 and "not the right one" in wrong.text and "guess" not in wrong.text
        api = await http.get("/api/info", headers={"accept": "application/json"})
        assert api.status_code == 401 and "token" in api.json()["error"]


@pytest.mark.parametrize("access_log", [False, True])
async def test_the_token_never_reaches_the_logs(virtual_server, autojump_clock, caplog, access_log):
    caplog.set_level(logging.DEBUG)
    handle = await virtual_server(auth_token=TOKEN, access_log=access_log)
    async with handle.http() as http:
        await http.get("/", params={"token": TOKEN})
        await http.get("/", params={"token": TOKEN + "x"})
        await http.get("/api/sessions", headers={"authorization": f"Bearer {TOKEN}x"})
        await http.get("/nothing-here", params={"token": TOKEN})
    for path in (f"/api/chat?voice_prompt=nope&token={TOKEN}", f"/v1/audio/duplex?token={TOKEN}x"):
        try:
            bad = await handle.bad_client(path)
        except Refused:
            continue
        await bad.read_until_closed(timeout=5)
        bad.close()
    async with handle.open_websocket(handle.ws_url + "/api/chat", token=TOKEN) as ws:
        await moshi_handshake(ws)
        await ws.send_message("a text frame, refused")  # a protocol error, logged
        await read_until_closed(ws)
    server_records = [r for r in caplog.records if not r.name.startswith(CLIENT_LOGGERS)]
    assert any("refused" in record.getMessage() for record in server_records)  # the capture works
    for record in server_records:
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
        assert TOKEN not in text, record
    assert TOKEN not in repr(handle.server.settings)
    access = [r.getMessage() for r in server_records if r.name == "pplex_trio.access"]
    if access_log:
        assert any(line.startswith('127.0.0.1 "GET /?token=***" 303 ') for line in access), access
        assert any('"GET /nothing-here?token=***" 404 ' in line for line in access), access
        assert any('"WebSocket /api/chat?voice_prompt=nope&token=***" 101 ' in line for line in access), access
        assert any('"WebSocket /v1/audio/duplex?token=***" 401 ' in line for line in access), access
    else:
        assert access == []


async def test_the_token_form_escapes_what_it_echoes(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    async with handle.http() as http:
        page = await http.get(
            '/"><script>alert(1)</script>',
            params={'"><img src=x>': '"><script>x</script>'},
            headers={"accept": "text/html"},
        )
    assert page.status_code == 401
    assert "<script>alert" not in page.text and "<img" not in page.text and "<script>x" not in page.text
    assert "&lt;script&gt;" in page.text


# -- origins ----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["moshi", "raw"])
async def test_origins(virtual_server, autojump_clock, protocol):
    handle = await virtual_server(allowed_origins="https://app.example.com")
    port, path = handle.port, WS_PATHS[protocol]
    assert await status_of_upgrade(handle, path) == 101  # a program: no Origin
    assert await status_of_upgrade(handle, path, [("Origin", f"http://127.0.0.1:{port}")]) == 101  # our own page
    assert await status_of_upgrade(handle, path, [("Origin", "https://app.example.com")]) == 101  # allowed
    for foreign in ("https://evil.example", f"http://localhost:{port}", f"http://127.0.0.1:{port + 1}", "null"):
        assert await status_of_upgrade(handle, path, [("Origin", foreign)]) == 403, foreign
    assert 'pplex_refused_total{reason="forbidden_origin"} 4.0' in handle.server.metrics.render().decode()


async def test_any_origin_with_a_star(virtual_server, autojump_clock):
    handle = await virtual_server(allowed_origins="*")
    assert await status_of_upgrade(handle, WS_PATHS["raw"], [("Origin", "https://evil.example")]) == 101


# -- connections per address -------------------------------------------------------------


async def test_connections_per_address_are_limited_and_come_back(virtual_server, autojump_clock):
    handle = await virtual_server(max_connections_per_ip=2)
    first = await handle.bad_client(WS_PATHS["raw"])
    second = await handle.bad_client(WS_PATHS["moshi"])
    with pytest.raises(Refused) as refused:
        await handle.bad_client(WS_PATHS["raw"])
    assert refused.value.status == 429 and "limit" in json.loads(refused.value.body)["error"]
    async with handle.http() as http:
        assert (await http.get("/health")).status_code == 200  # plain HTTP is not counted
    first.close()
    with trio.fail_after(5):  # the slot of the address comes back once the server sees the connection end
        while (status := await status_of_upgrade(handle, WS_PATHS["raw"])) == 429:
            await trio.sleep(0.05)
    assert status == 101
    second.close()
    assert 'pplex_refused_total{reason="too_many_connections"}' in handle.server.metrics.render().decode()


async def test_refused_connections_do_not_count_against_the_address(virtual_server, autojump_clock):
    handle = await virtual_server(max_connections_per_ip=1, auth_token=TOKEN)
    for _ in range(5):
        assert await status_of_upgrade(handle, WS_PATHS["raw"]) == 401
    assert await status_of_upgrade(handle, WS_PATHS["raw"], [("Authorization", f"Bearer {TOKEN}")]) == 101


# -- the session time limit ---------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["moshi", "raw"])
async def test_a_conversation_is_closed_at_the_time_limit(virtual_server, autojump_clock, protocol):
    handle = await virtual_server(max_session_seconds=0.6)
    async with handle.open_websocket(handle.ws_url + WS_PATHS[protocol]) as ws:
        if protocol == "raw":
            await ws.send_message(json.dumps({"type": "open"}))
        else:
            await moshi_handshake(ws)
        started = trio.current_time()
        closed = await read_until_closed(ws, timeout=5)
        lasted = trio.current_time() - started
    assert closed.code == 1000
    assert any("time limit of 0.6 s" in error for error in errors_in(closed.messages))
    assert lasted == pytest.approx(0.6)  # (its system prompt takes no time here): at the limit, not later
    metrics = handle.server.metrics.render().decode()
    assert f'pplex_sessions_ended_total{{outcome="time_limit",protocol="{protocol}"}} 1.0' in metrics


def test_the_access_log_masks_every_token_parameter_and_nothing_else():
    from pplex_trio.server.transport._access_log import masked_query

    assert masked_query(b"token=abc") == "token=***"
    assert masked_query(b"model=m&resume=Zx-9_q&resumable=1") == "model=m&resume=***&resumable=1"  # a resume token
    assert masked_query(b"a=1&token=abc%20d&b=token=y&xtoken=z&token=") == "a=1&token=***&b=token=y&xtoken=z&token=***"
    assert masked_query(b"resume=abc&resumable=1&token=t") == "resume=***&resumable=1&token=***"  # (a resume token)
