"""The status page (``/status``) in a real headless Chromium, behind the token, with a conversation running.

The web UI in another tab holds the conversation (the fake microphone's tone
through the echo engine); the status page must draw its plots and list it.

``PPLEX_TRIO_STATUS_SCREENSHOT=docs/status.png`` also saves the screenshot of
the documentation there, after a minute of history; the test itself writes
only under its ``tmp_path``.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest
from playwright.sync_api import expect

from _helpers.browser import open_ui, wait_phase

pytestmark = pytest.mark.browser

TOKEN = "tok-status-page-93c1"
SCREENSHOT_ENV = "PPLEX_TRIO_STATUS_SCREENSHOT"

# The pixels of a plot's p99 line: how many of the canvas' pixels have the page's --warn colour.
P99_PIXELS = """canvas => {
    const hex = getComputedStyle(document.documentElement).getPropertyValue("--warn").trim();
    const [r, g, b] = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
    const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let count = 0;
    for (let i = 0; i < data.length; i += 4) {
        if (Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 40 && data[i + 3] > 200) {
            count++;
        }
    }
    return count;
}"""


def test_the_status_page_plots_a_live_conversation(context: Any, start_server: Any, tmp_path: pathlib.Path):
    # The echo engine sleeps 5 ms a step, standing in for GPU time: the engine plot has something to show.
    server = start_server(slots=2, auth_token=TOKEN, model="echo:delay=1,prompt=4,step_ms=5")

    status = context.new_page()
    status.goto(f"{server.url}/status?token={TOKEN}")  # the cookie, for this page and the web UI's
    assert status.url == f"{server.url}/status"  # the token left the address bar
    expect(status.locator("#updated")).to_contain_text("Updated")
    expect(status.locator("#slots-free")).to_have_text("2")

    ui = open_ui(context, server)
    ui.locator("#persona").fill("You are the status page's test conversation.")
    ui.get_by_role("button", name="Connect").click()
    wait_phase(ui, "live")

    row = status.locator("#conversations tbody tr[data-session]")
    expect(row).to_have_count(1, timeout=10_000)
    expect(row).to_contain_text("moshi")
    expect(row).to_contain_text("live")
    expect(row).to_contain_text("You are the status page's test conversation.")
    expect(status.locator("#slots-live")).to_have_text("1")
    # Seconds of history with ticks: every plot has points, and its canvas the p99 line's pixels (a line that
    # grows a few pixels a second: waited for).
    for plot in ("lateness", "engine", "live"):
        canvas = status.locator(f"#plot-{plot}").element_handle()
        status.wait_for_function("el => Number(el.dataset.drawn) >= 6", arg=canvas, timeout=20_000)
        status.wait_for_function(f"el => ({P99_PIXELS})(el) > 40", arg=canvas, timeout=30_000)
    assert status.locator("#gpu").is_hidden()  # the echo engine runs on no GPU

    status.screenshot(path=str(tmp_path / "status.png"), full_page=True)
    assert (tmp_path / "status.png").stat().st_size > 10_000
    if target := os.environ.get(SCREENSHOT_ENV):
        status.wait_for_timeout(60_000)  # a minute of history for the documentation's picture
        status.screenshot(path=target, full_page=True)
