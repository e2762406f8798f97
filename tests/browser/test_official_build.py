"""The real official PersonaPlex client, when a build of it is at hand, with every security feature on.

Its Vite build cannot come with this repository or be made in CI (its source is on GitHub, and CI
reaches package registries only), so this test runs where ``PPLEX_TRIO_OFFICIAL_DIST`` names a
``dist/`` folder built from NVIDIA/personaplex's ``client/`` (``npm ci && npx vite build``), and is
skipped elsewhere. ``test_secure.py`` covers the same path in CI with a page that opens its socket
as the official client does.
"""

from __future__ import annotations

import os
import pathlib
import time

import httpx
import pytest
from playwright.sync_api import expect

from _helpers.official import server_process

pytestmark = pytest.mark.browser
DIST = os.environ.get("PPLEX_TRIO_OFFICIAL_DIST")
TOKEN = "official-build-token-5b2e8c0d1a"


@pytest.mark.skipif(not DIST, reason="set PPLEX_TRIO_OFFICIAL_DIST to a build of the official client")
def test_the_official_client_over_ssl_with_the_token_cookie(tls_context, tmp_path):
    assert DIST is not None and (pathlib.Path(DIST) / "index.html").is_file()
    with server_process(
        "--model", "echo", "--ssl", str(tmp_path / "tls"), "--static", DIST, env={"PPLEX_TRIO_AUTH_TOKEN": TOKEN}
    ) as url:
        page = tls_context.new_page()
        page.goto(url + "/")
        expect(page.get_by_role("heading", name="Access token")).to_be_visible()
        page.goto(url + f"/?token={TOKEN}")
        page.get_by_role("button", name="Connect").click()
        expect(page.get_by_role("button", name="Disconnect")).to_be_visible(timeout=20_000)
        with httpx.Client(verify=False, headers={"authorization": f"Bearer {TOKEN}"}) as http:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                sessions = http.get(url + "/api/sessions").json()["sessions"]
                if sessions and sessions[0]["state"] == "live" and sessions[0]["frames_decoded"] >= 25:
                    break
                time.sleep(0.2)
            assert sessions and sessions[0]["protocol"] == "moshi" and sessions[0]["frames_decoded"] >= 25
        expect(page.get_by_text("Missed audio:")).to_be_visible()


def audio_before_listening(frames: list[tuple[str, bytes]]) -> int:
    """Model audio messages (``0x01``) the page got before it sent its own first one.

    The official client adds its socket's message listener and starts its recorder in the same step, once
    its Opus decoder is ready (``useServerAudio.ts``): what comes before its first audio message is dropped
    unheard.
    """
    dropped = 0
    for direction, data in frames:
        if direction == "sent" and data[:1] == b"\x01":
            return dropped
        if direction == "received" and data[:1] == b"\x01":
            dropped += 1
    raise AssertionError("the page never sent audio")


@pytest.mark.skipif(not DIST, reason="set PPLEX_TRIO_OFFICIAL_DIST to a build of the official client")
@pytest.mark.parametrize("model", ["echo", "tiny"])
def test_the_official_client_hears_the_models_first_words(context, tmp_path, model):
    """With the server's defaults, the model's first step waits for the page's first frame: the page, which
    starts listening when it starts recording, drops at most one of the model's audio messages, even on a
    slow machine (the CPU throttled twelvefold: its Opus decoder takes a while to be ready; before, the page
    dropped 4 or 5 of the model's first audio messages there)."""
    assert DIST is not None
    frames: list[tuple[str, bytes]] = []

    def watch(ws) -> None:
        ws.on("framesent", lambda data: frames.append(("sent", data if isinstance(data, bytes) else b"")))
        ws.on("framereceived", lambda data: frames.append(("received", data if isinstance(data, bytes) else b"")))

    with server_process("--model", model, "--static", DIST, env={"PPLEX_TRIO_CACHE": str(tmp_path / "cache")}) as url:
        page = context.new_page()
        context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": 12})
        page.on("websocket", watch)
        page.goto(url + "/")
        page.get_by_role("button", name="Connect").click()
        expect(page.get_by_role("button", name="Disconnect")).to_be_visible(timeout=60_000)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(d == "received" and f[:1] == b"\x01" for d, f in frames) < 40:
            time.sleep(0.2)
        page.get_by_role("button", name="Disconnect").click()
    assert audio_before_listening(frames) <= 1
