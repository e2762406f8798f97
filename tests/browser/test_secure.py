"""Every security feature on, in a real browser: HTTPS and WSS, the token form and its cookie, origins.

Our web UI over ``wss://`` with a token; a page shaped like the official
client (served with ``--static``) that opens its socket the way the official
client does; and a page at another origin that tries to use the server
through the browser, which the Origin check must stop.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from playwright.sync_api import expect

from _helpers.browser import wait_phase, wait_until

pytestmark = pytest.mark.browser

TOKEN = "browser-token-5e1c9a7b3d"

# What the official client does with its socket (client/src/pages/Conversation, buildURL and
# useSocket): a WebSocket to /api/chat at location.hostname + ":" + location.port, wss:// under
# https://, its settings and two random seeds in the query, binary messages; the first message
# from the server is the 0x00 handshake.  No headers: a browser WebSocket cannot send any, so
# its way in is the cookie.
OFFICIAL_SHAPED_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>loading</title></head><body><script type="module">
const scheme = location.protocol === "https:" ? "wss" : "ws";
const query = new URLSearchParams({text_prompt: "You enjoy having a good conversation.",
  voice_prompt: "NATF2.pt", text_temperature: "0.7", text_topk: "25", audio_temperature: "0.8",
  audio_topk: "250", pad_mult: "0", text_seed: "4242", audio_seed: "4243", repetition_penalty: "1.0",
  repetition_penalty_context: "64"});
const own = `${scheme}://${location.hostname}:${location.port}`;
const target = new URLSearchParams(location.search).get("target") || own;
const ws = new WebSocket(`${target}/api/chat?${query}`);
ws.binaryType = "arraybuffer";
ws.onmessage = (event) => {
  if (new Uint8Array(event.data)[0] === 0) { document.title = "handshake"; ws.close(); }
};
ws.onclose = () => { if (document.title !== "handshake") document.title = "closed"; };
</script></body></html>
"""


def static_site(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir()
    (folder / "index.html").write_text(OFFICIAL_SHAPED_PAGE)
    return folder


def test_web_ui_over_wss_asks_for_the_token_and_goes_live(tls_context, start_server, tmp_path):
    server = start_server(ssl_dir=tmp_path / "tls", auth_token=TOKEN)
    assert server.url.startswith("https://")
    page = tls_context.new_page()
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(server.url + "/")
    expect(page.get_by_role("heading", name="Access token")).to_be_visible()
    page.get_by_label("Token").fill("not it")
    page.get_by_role("button", name="Continue").click()
    expect(page.get_by_role("alert")).to_contain_text("not the right one")
    page.get_by_label("Token").fill(TOKEN)
    page.get_by_role("button", name="Continue").click()
    expect(page.locator("#server-info")).to_contain_text("Model:")  # the UI, its /api calls let in by the cookie
    assert page.url == server.url + "/" and TOKEN not in page.url
    (cookie,) = tls_context.cookies()
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
    page.goto(server.url + "/?transport=websocket")  # (this test is the WebSocket's)
    expect(page.locator("#server-info")).to_contain_text("Model:")
    page.get_by_role("button", name="Connect").click()
    wait_phase(page, "live")
    assert sockets and all(url.startswith("wss://") for url in sockets), sockets
    wait_until(
        lambda: server.get("/api/sessions")["sessions"][0]["frames_decoded"] >= 10,
        10,
        "the server decoded < 1 s of the page's audio over WSS",
    )
    page.get_by_role("button", name="Disconnect").click()
    wait_phase(page, "ended")


def test_an_official_client_shaped_page_over_ssl_with_the_token_cookie(tls_context, start_server, tmp_path):
    server = start_server(ssl_dir=tmp_path / "tls", auth_token=TOKEN, static_dir=static_site(tmp_path / "site"))
    page = tls_context.new_page()
    page.goto(server.url + "/")  # no token yet: the form, not the client
    expect(page.get_by_role("heading", name="Access token")).to_be_visible()
    page.goto(server.url + f"/?token={TOKEN}")  # opened once with the token, as the docs say
    expect(page).to_have_title("handshake")
    assert page.url == server.url + "/"


def test_a_page_at_another_origin_cannot_use_the_server_through_the_browser(tls_context, start_server, tmp_path):
    server = start_server(ssl_dir=tmp_path / "tls", auth_token=TOKEN)
    elsewhere = start_server(ssl_dir=tmp_path / "tls2", static_dir=static_site(tmp_path / "site"))
    page: Any = tls_context.new_page()
    page.goto(server.url + f"/?token={TOKEN}")  # the user has the cookie (same site: 127.0.0.1)
    expect(page.locator("#server-info")).to_contain_text("Model:")
    target = server.url.replace("https://", "wss://")
    page.goto(elsewhere.url + f"/?target={target}")  # a page of another origin tries the user's server
    expect(page).to_have_title("closed")
    refused = [
        line
        for line in server.get_text("/metrics").splitlines()
        if line.startswith('pplex_refused_total{reason="forbidden_origin"}')
    ]
    assert refused == ['pplex_refused_total{reason="forbidden_origin"} 1.0']
    assert server.get("/health")["sessions"] == 0
