"""The official client's page at /official/ loads in a browser as the real one would."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from _helpers.official import fake_dist_files, fake_hub_cache, make_tgz, server_process

pytestmark = pytest.mark.browser


def test_official_client_page_runs_at_the_site_root(context, tmp_path):
    """Its bundle loads from /assets/, and its router sees the path "/" it knows."""
    hub = fake_hub_cache(tmp_path / "hub", make_tgz(fake_dist_files()))
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "PPLEX_TRIO_CACHE": str(tmp_path / "cache")}
    with server_process("--model", "echo", env=env) as url:
        page = context.new_page()
        page.goto(url + "/")
        link = page.get_by_role("link", name="the official client")
        expect(link).to_be_visible()
        link.click()
        expect(page).to_have_title("official client at /?official")
        page.reload()
        expect(page).to_have_title("official client at /?official")
