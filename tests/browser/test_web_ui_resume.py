"""The web UI keeps a call across a dropped connection: resume tokens (0x11), the hang-up (0x12), backoff.

Three levels: the pure functions of ``protocol.js`` and ``reconnect.js`` run in the browser; the page's
whole reconnect flow against a scripted server (Playwright's WebSocket routing: the test plays the
server's side of each socket); and the page against the real server through a relay that resets its
connections mid-call.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import pytest
from playwright.sync_api import expect

from _helpers.browser import open_ui, wait_phase, wait_stat_above, wait_until
from _helpers.relay import Relay

pytestmark = pytest.mark.browser

HANDSHAKE = b"\x00"
HANGUP = b"\x12"


def resume_offer(token: str, **extra: Any) -> bytes:
    return b"\x11" + json.dumps({"token": token, **extra}).encode()


def run_module(context: Any, server: Any, module: str, body: str, arg: Any = None) -> Any:
    """Evaluate ``body`` (a function of the module's exports ``m`` and ``arg``) in a page of ``server``."""
    tab = context.new_page()
    tab.goto(server.url + "/")
    return tab.evaluate(
        f"async (arg) => {{ const m = await import('/js/{module}'); return ({body})(m, arg); }}",
        arg,
    )


def test_protocol_encodes_the_hangup_and_decodes_resume_offers(context, start_server):
    server = start_server()
    messages = [
        list(resume_offer("tok-1")),
        list(resume_offer("tok-2", resumed=True, notice="settings of a resume are ignored")),
        list(b"\x11not json"),
        list(b"\x11" + json.dumps({"resumed": True}).encode()),  # no token
        list(b"\x11" + json.dumps({"token": 7}).encode()),
        list(b"\x12"),  # a client kind from the server: not ours to act on
    ]
    result = run_module(
        context,
        server,
        "protocol.js",
        "(m, messages) => ({hangup: Array.from(m.encodeHangup()), "
        "decoded: messages.map((bytes) => m.decodeMessage(new Uint8Array(bytes)))})",
        messages,
    )
    assert result["hangup"] == [0x12]
    assert result["decoded"] == [
        {"type": "resume", "token": "tok-1", "resumed": False},
        {"type": "resume", "token": "tok-2", "resumed": True, "notice": "settings of a resume are ignored"},
        {"type": "invalid", "reason": "resume offer is not JSON"},
        {"type": "invalid", "reason": "resume offer has no token"},
        {"type": "invalid", "reason": "resume offer has no token"},
        {"type": "unknown", "kind": 0x12},
    ]


def test_backoff_doubles_to_4_s_and_gives_up_at_the_window(context, start_server):
    server = start_server()
    result = run_module(
        context,
        server,
        "reconnect.js",
        """(m) => {
            // Attempts that fail at once: each starts when the previous one's delay has passed.
            const starts = [];
            let elapsed = 0;
            for (let attempt = 1; attempt < 50; attempt++) {
                const delay = m.nextAttemptDelay(attempt, elapsed);
                if (delay === null) break;
                elapsed += delay;
                starts.push(elapsed);
            }
            return {
                delays: [1, 2, 3, 4, 5, 6, 9].map((n) => m.backoffDelay(n)),
                starts,
                late: m.nextAttemptDelay(1, 19_900),
                drops: [[1006, ""], [1005, ""], [1006, "refused"], [1000, ""], [1001, ""], [1008, ""], [1011, ""]]
                    .map(([code, message]) => m.isDrop(code, message)),
                labels: [1, 2, 7].map(m.reconnectingText),
                lost: [m.lostEnding(), m.lostEnding("token expired")],
            };
        }""",
    )
    assert result["delays"] == [250, 500, 1000, 2000, 4000, 4000, 4000]
    # 250, +500, +1000, +2000, then +4000 while the attempt still starts inside the 20 s window.
    assert result["starts"] == [250, 750, 1750, 3750, 7750, 11750, 15750, 19750]
    assert result["late"] is None  # 19.9 s + 250 ms is past the window
    assert result["drops"] == [True, True, False, False, False, False, False]
    assert result["labels"] == ["Reconnecting…", "Reconnecting… (attempt 2)", "Reconnecting… (attempt 7)"]
    assert result["lost"] == [
        {"ok": False, "text": "The call was lost: start a new one."},
        {"ok": False, "text": "The call was lost: start a new one. (token expired)"},
    ]


class ScriptedServer:
    """The server's side of every /api/chat socket the page opens, played by the test."""

    def __init__(self, page: Any):
        self.page = page
        self.sockets: list[Any] = []  # WebSocketRoute, in the order the page opened them
        self.received: list[list[bytes]] = []  # what the page sent on each
        self.drop_on_open = False  # reset each new socket at once (a server that is not there)
        page.route_web_socket("**/api/chat**", self._opened)

    def _opened(self, ws: Any) -> None:
        got: list[bytes] = []
        ws.on_message(lambda message: got.append(message if isinstance(message, bytes) else message.encode()))
        self.sockets.append(ws)
        self.received.append(got)
        if self.drop_on_open:
            ws.close(code=1006)

    def query(self, n: int) -> dict[str, str]:
        return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.sockets[n].url).query))

    def wait_sockets(self, n: int) -> Any:
        self.wait(lambda: len(self.sockets) >= n, f"the page did not open socket {n}")
        return self.sockets[n - 1]

    def wait(self, condition: Any, message: str, timeout: float = 10) -> None:
        """Like ``wait_until``, but Playwright's events (our handlers) run meanwhile."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail(f"{message} (waited {timeout} s)")
            self.page.wait_for_timeout(50)


def test_a_dropped_call_reconnects_with_the_latest_token_and_goes_on(context, start_server):
    """Drop → "Reconnecting…" → /api/chat?resume=TOKEN&ticket=… → live again, the transcript kept;
    each resume uses the newest token; a refused resume says the call was lost."""
    server = start_server()
    page = open_ui(context, server)
    scripted = ScriptedServer(page)
    page.get_by_role("button", name="Connect").click()

    first = scripted.wait_sockets(1)
    opening = scripted.query(0)
    assert opening["resumable"] == "1" and opening["ticket"] and "text_prompt" in opening
    first.send(HANDSHAKE)
    first.send(resume_offer("first-token"))
    first.send(b"\x02 hello")
    wait_phase(page, "live")
    expect(page.locator("#transcript")).to_have_text("hello")
    scripted.wait(lambda: len(scripted.received[0]) >= 3, "the page sent no audio")  # OpusHead, OpusTags, …

    first.close(code=1006)  # no close frame: the connection was lost
    wait_phase(page, "reconnecting")
    expect(page.locator("#state")).to_contain_text("Reconnecting…")
    expect(page.get_by_role("button", name="Disconnect")).to_be_visible()  # the call is still on
    second = scripted.wait_sockets(2)
    assert scripted.query(1) == {"resume": "first-token", "ticket": opening["ticket"]}
    second.send(HANDSHAKE)
    second.send(resume_offer("second-token", resumed=True))
    wait_phase(page, "live")
    expect(page.locator("#state")).to_have_text("Live")
    expect(page.locator("#transcript")).to_have_text("hello")  # the same call goes on
    # A new Ogg stream on the new connection: it starts with our OpusHead.
    scripted.wait(lambda: scripted.received[1], "the page sent no audio after the resume")
    assert scripted.received[1][0][0] == 0x01 and b"OpusHead" in scripted.received[1][0]

    second.close(code=1006)
    third = scripted.wait_sockets(3)
    assert scripted.query(2)["resume"] == "second-token"  # each resume gives a new token
    third.send(b"\x05this resume token is unknown, used or expired: start a new call")
    third.close(code=1008)
    wait_phase(page, "ended")
    expect(page.locator("#ending")).to_have_text(
        "The call was lost: start a new one. (this resume token is unknown, used or expired: start a new call)"
    )
    assert len(scripted.sockets) == 3


def test_without_a_token_a_drop_ends_the_call_as_before(context, start_server):
    """A server that sends no 0x11 (today's, or one that does not resume): a drop ends the call at once."""
    server = start_server()
    page = open_ui(context, server)
    scripted = ScriptedServer(page)
    page.get_by_role("button", name="Connect").click()
    scripted.wait_sockets(1).send(HANDSHAKE)
    wait_phase(page, "live")
    scripted.sockets[0].close(code=1006)
    wait_phase(page, "ended")
    expect(page.locator("#ending")).to_have_text("The connection was lost (is the server running?).")
    page.wait_for_timeout(500)
    assert len(scripted.sockets) == 1


def test_reconnecting_gives_up_after_the_resume_window(context, start_server):
    """Every attempt fails: the page tries with backoff and, 20 s after the drop, says the call was lost."""
    server = start_server()
    page = open_ui(context, server)
    scripted = ScriptedServer(page)
    page.get_by_role("button", name="Connect").click()
    scripted.wait_sockets(1).send(HANDSHAKE)
    scripted.sockets[0].send(resume_offer("only-token"))
    wait_phase(page, "live")
    # From here the page's new timers run on the test's clock, paused: only run_for moves it.
    page.clock.install()
    page.clock.pause_at(int(time.time() * 1000) + 1000)
    scripted.drop_on_open = True
    scripted.sockets[0].close(code=1006)
    wait_phase(page, "reconnecting")
    labels = set()
    virtual_ms = 0
    while page.locator("#state").get_attribute("data-phase") == "reconnecting" and virtual_ms < 30_000:
        page.clock.run_for(50)
        virtual_ms += 50
        labels.add(page.locator("#state-text").inner_text())
    expect(page.locator("#ending")).to_have_text(
        "The call was lost: start a new one. (no answer within the server's resume window)"
    )
    # Attempts at 0.25, 0.75, 1.75, 3.75, 7.75, 11.75, 15.75 and 19.75 s when each fails at once; a failure
    # lands here up to a step or two late, which may push the last one past the window.
    attempts = len(scripted.sockets) - 1
    assert 7 <= attempts <= 8, attempts
    assert all(
        scripted.query(n) == {"resume": "only-token", "ticket": scripted.query(0)["ticket"]}
        for n in range(1, attempts + 1)
    )
    assert {"Reconnecting… (attempt 2)", f"Reconnecting… (attempt {attempts})"} <= labels, labels
    # It gives up once no further attempt can start inside the window, and never later than the window.
    print(f"{attempts} attempts, gave up {virtual_ms} ms after the drop (virtual time)")
    assert 16_000 <= virtual_ms <= 20_100, virtual_ms


def test_disconnect_sends_the_hangup_before_closing(context, start_server):
    """The real server: Disconnect's last message on the socket is 0x12, so the server ends the call at once."""
    server = start_server()
    page = open_ui(context, server)
    sent: list[bytes] = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda payload: sent.append(payload)))
    page.get_by_role("button", name="Connect").click()
    wait_phase(page, "live")
    wait_stat_above(page, "played", 0.5)
    page.get_by_role("button", name="Disconnect").click()
    wait_phase(page, "ended")
    expect(page.locator("#ending")).to_have_text("You ended the conversation.")
    assert sent[-1] == HANGUP, sent[-3:]
    assert sent.count(HANGUP) == 1

    def slot_free() -> bool:  # not held for a resume (a drop would hold it for 20 s)
        health = server.get("/health")
        return health["slots_free"] == health["slots_total"] and health["sessions"] == 0

    wait_until(slot_free, 5, "the slot was not freed after Disconnect")


def test_the_page_resumes_the_real_server_after_a_reset(context, start_server):
    """Through a relay that resets every connection mid-call: "Reconnecting…", then live again, the same session."""
    server = start_server()
    relay = Relay(int(urllib.parse.urlsplit(server.url).port or 0))
    try:
        page = context.new_page()
        received: list[bytes] = []
        urls: list[str] = []

        def watch(ws: Any) -> None:
            urls.append(ws.url)
            ws.on("framereceived", lambda payload: received.append(payload if isinstance(payload, bytes) else b""))

        page.on("websocket", watch)
        page.goto(relay.url + "/?transport=websocket")
        expect(page.locator("#server-info")).to_contain_text("Model:")
        page.get_by_role("button", name="Connect").click()
        wait_phase(page, "live")
        assert "resumable=1" in urls[0]
        deadline = time.monotonic() + 2
        while not any(m[:1] == b"\x11" for m in received) and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        offers = [json.loads(m[1:]) for m in received if m[:1] == b"\x11"]
        assert offers, "the server sent no resume token (0x11) to a page that asked for one"
        wait_stat_above(page, "played", 1.0)
        (before,) = server.get("/api/sessions")["sessions"]

        relay.drop()
        wait_phase(page, "reconnecting", timeout=5_000)
        expect(page.locator("#state")).to_contain_text("Reconnecting…")
        wait_phase(page, "live", timeout=20_000)
        assert f"resume={offers[0]['token']}" in urls[-1]
        played = float(page.locator("#stat-played").get_attribute("data-value") or 0)
        wait_stat_above(page, "played", played + 1.0)  # the model's audio flows again
        (after,) = server.get("/api/sessions")["sessions"]
        assert after["id"] == before["id"]
        page.get_by_role("button", name="Disconnect").click()
        wait_phase(page, "ended")
    finally:
        relay.close()
