"""The status page (``/status``) in a real headless Chromium, behind the token, with a conversation running
(and, with a server that transcribes the caller, both sides' words there and on the web UI).

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

# Whether the web UI's "You:" lines, their marks and spaces left out, say ``arg``.
CALLER_LINES_SAY = """said => [...document.querySelectorAll("#transcript [data-speaker=caller]")]
    .map(line => line.textContent.replace(/^You: /, "")).join("").replace(/\\s/g, "") === said"""


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


def test_both_sides_words_on_the_web_ui_and_the_status_page(context: Any, start_server: Any):
    """With a server that transcribes the caller (the echo's scripted transcript), the web UI asks for both
    sides and marks each speaker's lines, and the status page's "latest words" shows each side's."""
    from pplex_trio.engine import EchoEngine
    from pplex_trio.engine._echo import scripted_transcript

    engine = EchoEngine(2, prefill_steps=4, transcript=scripted_transcript({6: " hel", 7: "lo", 9: " world"}, {16}))
    server = start_server(engine, slots=2, auth_token=TOKEN)
    status = context.new_page()
    status.goto(f"{server.url}/status?token={TOKEN}")
    expect(status.locator("#updated")).to_contain_text("Updated")

    ui = open_ui(context, server)
    ui.get_by_role("button", name="Connect").click()
    wait_phase(ui, "live")
    caller = ui.locator("#transcript [data-speaker=caller]")
    expect(caller.first).to_contain_text("You: ", timeout=10_000)
    # The caller's pieces, each in a "You:" line (the agent's lines fall between them as the two sides interleave).
    ui.wait_for_function(CALLER_LINES_SAY, arg="helloworld", timeout=10_000)
    expect(ui.locator("#transcript [data-speaker=agent]").first).to_contain_text("Model: 0 1")

    words = status.locator("#conversations tbody tr[data-session] td.words")
    expect(words.locator("[data-speaker=caller]")).to_have_text("caller: hello world", timeout=10_000)
    expect(words.locator("[data-speaker=agent]")).to_contain_text("agent: ")
    ui.get_by_role("button", name="Disconnect").click()
