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
    with server_process("--model", "echo", "--ssl", str(tmp_path / "tls"), "--static", DIST,
                        env={"PPLEX_TRIO_AUTH_TOKEN": TOKEN}) as url:
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
