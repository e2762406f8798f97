""" "Your voice" in a real Chromium: record a clip with the (fake) microphone, hear it, name it, add it, pick
it, talk with it; a refused clip is explained in words; the panel is absent where uploads are off."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from _helpers.browser import open_ui, wait_phase

pytestmark = pytest.mark.browser


def open_panel(context, server):
    page = open_ui(context, server)
    panel = page.locator("#your-voice")
    expect(panel).to_be_visible()
    panel.locator("summary").click()
    return page


def test_record_name_add_pick_and_talk(context, start_server):
    server = start_server()
    page = open_panel(context, server)
    add = page.get_by_role("button", name="Add this voice")
    expect(add).to_be_disabled()
    page.get_by_role("button", name="Record", exact=True).click()
    expect(page.locator("#clip-countdown")).to_have_text(re.compile(r"Recording in [123]…"))
    expect(page.locator("#clip-countdown")).to_contain_text("Recording… 1.", timeout=10_000)  # the clip grows
    level = page.locator("#clip-meter").locator("..")
    assert int(level.get_attribute("aria-valuenow")) > 50  # the fake microphone's tone shows on the meter
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(page.locator("#clip-status")).to_contain_text("Recorded")
    expect(page.locator("#clip-playback")).to_be_visible()
    assert page.locator("#clip-playback").get_attribute("src").startswith("blob:")
    page.get_by_label("Name").fill("MyTone")
    expect(add).to_be_disabled()  # not before the consent box
    page.get_by_label("This is my voice").check()
    add.click()
    expect(page.locator("#clip-status")).to_have_text("Added MyTone.pt: it is now picked in the voice list.")
    expect(page.locator("#voice")).to_have_value("MyTone.pt")
    expect(page.locator("#voice option[value='MyTone.pt']")).to_have_text("MyTone (added)")
    listed = server.get("/api/voices")
    assert listed["added"] == ["MyTone.pt"]
    # The conversation takes the voice.
    page.get_by_role("button", name="Connect").click()
    wait_phase(page, "live")
    assert server.engine.started[-1][1].voice == "MyTone.pt"
    page.get_by_role("button", name="Disconnect").click()


def test_a_refused_clip_is_explained_in_words(context, start_server, tmp_path):
    server = start_server()
    page = open_panel(context, server)
    garbage = tmp_path / "noise.wav"
    garbage.write_bytes(b"RIFF" + bytes(range(256)) * 64)
    page.locator("#clip-file").set_input_files(str(garbage))
    expect(page.locator("#clip-status")).to_contain_text("noise.wav: listen to it")
    page.get_by_label("Name").fill("Noise")
    page.get_by_label("This is my voice").check()
    page.get_by_role("button", name="Add this voice").click()
    status = page.locator("#clip-status")
    expect(status).to_contain_text("Not added: not a recording this server can read")
    expect(status).to_have_attribute("role", "alert")
    # A name the model already has is refused in words too.
    page.get_by_label("Name").fill("NATF0")
    page.get_by_role("button", name="Add this voice").click()
    expect(status).to_contain_text("Not added: NATF0.pt is one of the model's own voices")
    assert server.get("/api/voices")["added"] == []


def test_no_panel_where_uploads_are_off(context, start_server):
    server = start_server(voice_uploads="off")
    page = open_ui(context, server)
    expect(page.locator("#your-voice")).to_be_hidden()
