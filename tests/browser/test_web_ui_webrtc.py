"""Our page over WebRTC in Chromium, against the echo server: it says which transport it uses, the caller's speech
comes back (found in the page's own recording: the model left, the microphone right), the model's words are
shown; ``?transport=websocket``, an older server and a call that does not connect fall back to the WebSocket."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import expect

from _helpers.browser import (
    disable_voice_processing,
    download_recording,
    stat,
    wait_phase,
    wait_stat_above,
    wait_until,
)
from _helpers.rtc_page import echo_lag
from _helpers.udp_relay import Direction, UdpRelay

pytestmark = [pytest.mark.browser, pytest.mark.serial]  # (timing-bound: run alone, after the parallel suite)

TOKEN = "browser-page-token"


def metric(server: Any, line_start: str) -> float:
    lines = [line for line in server.get_text("/metrics").splitlines() if line.startswith(line_start)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def talk(context: Any, server: Any, query: str = "", voice: str | None = None) -> Any:
    """Our page opened with ``?token=`` (the server hands out its cookie and drops the token from the address),
    the raw microphone (and ``voice``), connected and live."""
    page = context.new_page()
    page.goto(f"{server.url}/{query}{'&' if query else '?'}token={TOKEN}")
    expect(page.locator("#server-info")).to_contain_text("Model:")
    assert page.url == f"{server.url}/{query}"
    if voice is not None:
        page.get_by_label("Voice", exact=True).select_option(label=voice)
    disable_voice_processing(page)
    page.get_by_role("button", name="Connect").click()
    wait_phase(page, "live")
    return page


def check_echo_and_words(page: Any) -> float:
    """The page played its microphone back (the echo engine's), and showed the engine's words in order."""
    wait_stat_above(page, "played", 6.0)
    stereo, rate = download_recording(page)
    assert rate == 48_000
    # Audio the page missed (an underrun on a busy machine; the stats show it) delays all that follows.
    lag = echo_lag(stereo[:, 0], stereo[:, 1], spread_s=0.081 + stat(page, "missed"))
    numbers = page.locator("#transcript").inner_text().split()
    assert len(numbers) >= 30 and numbers == [str(i) for i in range(len(numbers))], numbers[:40]
    return lag


def test_the_page_talks_over_webrtc(speaking_context, start_server):
    """The page's call is a WebRTC call (``realtime_webrtc``) with the persona and voice chosen; it says so; the
    echo and the words; Disconnect hangs the call up and frees the slot."""
    server = start_server(auth_token=TOKEN)
    hangups = metric(server, 'pplex_webrtc_calls_ended_total{reason="hangup"}')
    sockets: list[str] = []
    page = talk(speaking_context, server, voice="Natural male 1")
    page.on("websocket", lambda ws: sockets.append(ws.url))
    expect(page.locator("#transport")).to_have_text("Connected over WebRTC")
    wait_until(lambda: server.engine.started, 10, "the call's conversation did not start")  # (at its first audio)
    rows = server.get("/api/sessions")["sessions"]
    assert [row["protocol"] for row in rows] == ["realtime_webrtc"]
    _, conversation = server.engine.started[-1]
    assert conversation.persona == page.get_by_label("Who should the model be?").input_value().strip()
    assert conversation.voice == "NATM1.pt"
    lag = check_echo_and_words(page)
    print(f"page over WebRTC: echo at {lag * 1000:.0f} ms")
    assert sockets == []

    page.get_by_role("button", name="Disconnect").click()
    wait_phase(page, "ended")
    expect(page.locator("#ending")).to_have_text("You ended the conversation.")
    wait_until(lambda: server.get("/api/sessions")["sessions"] == [], 5, "the call outlived Disconnect")
    wait_until(
        lambda: metric(server, 'pplex_webrtc_calls_ended_total{reason="hangup"}') == hangups + 1,
        5,
        "Disconnect did not hang the call up",
    )


def test_transport_websocket_forces_the_fallback(speaking_context, start_server):
    """``?transport=websocket``: the page's Moshi WebSocket, as before, and it says why."""
    server = start_server(auth_token=TOKEN)
    page = talk(speaking_context, server, "?transport=websocket")
    expect(page.locator("#transport")).to_have_text(
        "Connected over WebSocket (fallback: asked for with ?transport=websocket)"
    )
    assert [row["protocol"] for row in server.get("/api/sessions")["sessions"]] == ["moshi"]
    check_echo_and_words(page)


def test_an_older_server_falls_back(speaking_context, start_server):
    """A server without the WebRTC routes (404): the page goes on over the WebSocket."""
    server = start_server(auth_token=TOKEN)
    speaking_context.route(re.compile(r".*/v1/realtime/calls$"), lambda route: route.fulfill(status=404))
    page = talk(speaking_context, server)
    expect(page.locator("#transport")).to_have_text(
        "Connected over WebSocket (fallback: this server does not take WebRTC calls (HTTP 404))"
    )
    check_echo_and_words(page)


def test_a_call_that_does_not_connect_falls_back(speaking_context, start_server):
    """The answer's candidates lead nowhere (as through a firewall that drops UDP): after a few seconds the page
    hangs the call up and goes on over the WebSocket."""
    server = start_server(auth_token=TOKEN)
    hangups = metric(server, 'pplex_webrtc_calls_ended_total{reason="hangup"}')

    def unreachable(route: Any) -> None:
        response = route.fetch()
        answer = re.sub(r"(a=candidate:\S+ \d+ udp \d+ \S+) \d+", r"\1 9", response.text())
        route.fulfill(response=response, body=answer)

    speaking_context.route(re.compile(r".*/v1/realtime/calls$"), unreachable)
    page = talk(speaking_context, server)
    expect(page.locator("#transport")).to_have_text(
        "Connected over WebSocket (fallback: the WebRTC call did not connect within 5 s)"
    )
    assert [row["protocol"] for row in server.get("/api/sessions")["sessions"]] == ["moshi"]
    assert metric(server, 'pplex_webrtc_calls_ended_total{reason="hangup"}') == hangups + 1


# Keeps the page's peer connections where the test can reach them.
KEEP_PEER_CONNECTIONS = """
const Native = window.RTCPeerConnection;
window.peerConnections = [];
window.RTCPeerConnection = class extends Native {
  constructor(...args) {
    super(...args);
    window.peerConnections.push(this);
  }
};
"""

# The browser reports the current connection failed (as when the network under it changes).
FAIL_CONNECTION = """() => {
  const pc = window.peerConnections.at(-1);
  Object.defineProperty(pc, "connectionState", { get: () => "failed" });
  pc.dispatchEvent(new Event("connectionstatechange"));
}"""

# What the page's state says from now on, each change.
NOTE_STATES = """() => {
  window.states = [];
  const text = document.getElementById("state-text");
  new MutationObserver(() => window.states.push(text.textContent)).observe(text, { childList: true });
}"""


# What the browser made of the server's RTCP reports: its audio's, by type.
REPORTED = """async () => {
  const stats = await window.peerConnections.at(-1).getStats();
  const reported = {};
  stats.forEach((s) => {
    if (s.kind === "audio" && ["remote-inbound-rtp", "remote-outbound-rtp", "inbound-rtp"].includes(s.type)) {
      reported[s.type] = s;
    }
  });
  return reported;
}"""


def test_chromium_takes_the_servers_reports_of_the_call(speaking_context, start_server):
    """The server's RTCP, read by Chromium: its reception reports (the browser's losses and round trip, by which
    it sets its Opus FEC) and its sender reports on the voice (counted as Chromium counts what came)."""
    server = start_server(auth_token=TOKEN)
    speaking_context.add_init_script(KEEP_PEER_CONNECTIONS)
    page = talk(speaking_context, server)
    wait_stat_above(page, "played", 4.0)
    reported = page.evaluate(REPORTED)
    told, sent, came = reported["remote-inbound-rtp"], reported["remote-outbound-rtp"], reported["inbound-rtp"]
    assert told["packetsLost"] == 0 and told["fractionLost"] == 0  # (no network between them to lose any)
    assert told["roundTripTimeMeasurements"] >= 1 and 0 <= told["roundTripTime"] < 1.0
    assert sent["reportsSent"] >= 2 and 0 < sent["packetsSent"] <= came["packetsReceived"]  # (reported before)
    assert came["packetsReceived"] - sent["packetsSent"] < 2 * 50  # (as of the last report: a second or two ago)


def test_a_failed_connection_is_offered_again_and_the_call_goes_on(speaking_context, start_server):
    """The connection fails mid-call (the browser's report of it is the test's; the rest is real): the page shows
    "Reconnecting…", offers a new peer connection to the call's Location, and the same session goes on: its row,
    the engine's words counting on, the echo in what is played after."""
    server = start_server(auth_token=TOKEN)
    speaking_context.add_init_script(KEEP_PEER_CONNECTIONS)
    offers: list[str] = []
    speaking_context.on("request", lambda r: r.method == "POST" and offers.append(r.url.removeprefix(server.url)))
    page = talk(speaking_context, server)
    (row,) = server.get("/api/sessions")["sessions"]
    wait_stat_above(page, "played", 2.0)
    page.evaluate(NOTE_STATES)
    page.evaluate(FAIL_CONNECTION)
    wait_phase(page, "live")
    states = page.evaluate("window.states")
    assert states[:1] == ["Reconnecting…"] and states[-1] == "Live", states
    assert page.evaluate("window.peerConnections.length") == 2
    assert len(offers) == 2 and offers[0] == "/v1/realtime/calls", offers
    assert re.fullmatch(r"/v1/realtime/calls/rtc_[0-9a-f]{24}", offers[1]), offers  # (the call's Location)
    assert server.get("/api/sessions")["sessions"][0]["id"] == row["id"]
    before = len(page.locator("#transcript").inner_text().split())
    wait_stat_above(page, "played", 8.0)
    numbers = page.locator("#transcript").inner_text().split()
    assert len(numbers) > before + 30 and numbers == [str(i) for i in range(len(numbers))], numbers
    stereo, _ = download_recording(page)
    lag = echo_lag(stereo[-4 * 48_000 :, 0], stereo[-4 * 48_000 :, 1], skip_s=0)
    print(f"after the new offer: echo at {lag * 1000:.0f} ms")


# Keeps what the page's data channels receive where the test can read it.
KEEP_CHANNEL_EVENTS = """
window.channelEvents = [];
const createDataChannel = RTCPeerConnection.prototype.createDataChannel;
RTCPeerConnection.prototype.createDataChannel = function (...args) {
  const channel = createDataChannel.apply(this, args);
  channel.addEventListener("message", (e) => window.channelEvents.push(JSON.parse(e.data)));
  return channel;
};
"""

# What the echo "hears" the caller say, by the conversation's frame (whatever the audio), and the frame its
# end-of-turn head ends the caller's turn at (the fake microphone loops its speech with no pause long enough for
# the server's VAD to end it).
HEARD = {8: " What's", 9: " the", 11: " weather?"}
TURN_ENDS = {16}


def test_the_callers_words_over_webrtc(speaking_context, start_server):
    """A server that transcribes the caller: the page's Realtime session asks for ``audio.input.transcription``,
    and the caller's words (``.delta`` pieces, then ``.completed``) show once, in "You:" lines among the model's."""
    from pplex_trio.engine import EchoEngine
    from pplex_trio.engine._echo import scripted_transcript

    engine = EchoEngine(2, prefill_steps=4, transcript=scripted_transcript(HEARD, TURN_ENDS))
    server = start_server(engine, auth_token=TOKEN)
    speaking_context.add_init_script(KEEP_CHANNEL_EVENTS)
    forms: list[bytes] = []
    speaking_context.on(
        "request", lambda r: r.url.endswith("/v1/realtime/calls") and forms.append(r.post_data_buffer or b"")
    )
    page = talk(speaking_context, server)
    expect(page.locator("#transport")).to_have_text("Connected over WebRTC")
    (form,) = forms
    session = json.loads(re.search(rb'name="session"\r\n\r\n(.*?)\r\n--', form, re.S).group(1))
    assert session["audio"]["input"] == {"transcription": {}}, session

    caller = page.locator("#transcript [data-speaker=caller]")
    expect(caller.first).to_have_text("You: What's", timeout=10_000)
    expect(page.locator("#transcript [data-speaker=agent]").first).to_contain_text("Model: 0 1")
    completed = """() => window.channelEvents.some(
        (e) => e.type === "conversation.item.input_audio_transcription.completed")"""
    page.wait_for_function(completed, timeout=15_000)
    events = page.evaluate("window.channelEvents")
    said = [e for e in events if e["type"].startswith("conversation.item.input_audio_transcription.")]
    assert "".join(e["delta"] for e in said if e["type"].endswith(".delta")) == "".join(HEARD.values())
    assert [e["transcript"] for e in said if e["type"].endswith(".completed")][:1] == ["What's the weather?"]
    # The caller's pieces, each in a "You:" line as the two sides interleave; the completed turn repeats the
    # pieces already shown, so the words stay once on the page.
    assert "".join(line.removeprefix("You: ") for line in caller.all_inner_texts()) == "What'stheweather?"


# A browser without WebCodecs: its encoder and decoder gone before the page's scripts run.
NO_WEBCODECS = "delete window.AudioEncoder; delete window.AudioDecoder;"
NO_OPUS = "This browser cannot encode Opus audio (WebCodecs), which the WebSocket needs"
USE_ANOTHER = "Use a recent Chrome, Edge or Firefox."


def test_webrtc_does_not_wait_for_webcodecs(speaking_context, start_server):
    """WebRTC has the browser's own Opus: without WebCodecs the page still connects over it, and the echo and
    the words come back."""
    server = start_server(auth_token=TOKEN)
    speaking_context.add_init_script(NO_WEBCODECS)
    page = talk(speaking_context, server)
    assert page.evaluate("[typeof AudioEncoder, typeof AudioDecoder]") == ["undefined", "undefined"]
    expect(page.locator("#transport")).to_have_text("Connected over WebRTC")
    check_echo_and_words(page)


def test_without_webcodecs_the_websocket_says_why(speaking_context, start_server):
    """Without WebCodecs the WebSocket cannot talk: with ``?transport=websocket`` Connect stays off and the page
    says why; where a WebRTC call falls through (an older server), the page says both why and makes no call."""
    server = start_server(auth_token=TOKEN)
    speaking_context.add_init_script(NO_WEBCODECS)
    page = speaking_context.new_page()
    page.goto(f"{server.url}/?transport=websocket&token={TOKEN}")
    expect(page.locator("#server-info")).to_contain_text("Model:")
    expect(page.locator("#ending")).to_have_text(
        f"{NO_OPUS} (WebRTC, without ?transport=websocket, does not). {USE_ANOTHER}"
    )
    expect(page.get_by_role("button", name="Connect")).to_be_disabled()

    speaking_context.route(re.compile(r".*/v1/realtime/calls$"), lambda route: route.fulfill(status=404))
    page.goto(f"{server.url}/")  # (the token's cookie from before)
    connect = page.get_by_role("button", name="Connect")
    connect.click()
    wait_phase(page, "ended")
    expect(page.locator("#ending")).to_have_text(
        f"WebRTC could not be used (this server does not take WebRTC calls (HTTP 404)). {NO_OPUS}. {USE_ANOTHER}"
    )
    assert server.get("/api/sessions")["sessions"] == []
    expect(connect).to_be_enabled()


def test_over_webrtc_only_the_audio_temperature_is_carried_and_the_page_says_so(speaking_context, start_server):
    """The Realtime session has a temperature (the audio's) and no text temperature, top-k or seed: over WebRTC the
    page carries the one, says so beside the others, and the engine runs those at the server's defaults; with
    ``?transport=websocket`` (which carries them all) the note is not shown."""
    from pplex_trio._conversation import Sampling

    server = start_server(auth_token=TOKEN)
    page = speaking_context.new_page()
    page.goto(f"{server.url}/?token={TOKEN}")
    page.get_by_text("Advanced settings").click()
    note = page.locator("#webrtc-settings")
    expect(note).to_have_text(
        "Over WebRTC only the audio temperature is used: the Realtime session has no text temperature, top-k or"
        " seed (the server's defaults apply)."
    )
    page.get_by_label("Text temperature").fill("0.5")
    page.get_by_label("Text top-k").fill("10")
    page.get_by_label("Audio temperature").fill("0.6")
    page.get_by_label("Audio top-k").fill("100")
    page.get_by_label("Seed").fill("42")
    page.get_by_role("button", name="Connect").click()
    wait_phase(page, "live")
    expect(page.locator("#transport")).to_have_text("Connected over WebRTC")
    wait_until(lambda: server.engine.started, 5, "the call's conversation did not start")  # (at its first audio)
    s = server.engine.started[-1][1].sampling
    defaults = Sampling()
    assert s.audio_temperature == 0.6
    assert (s.text_temperature, s.text_topk, s.audio_topk) == (
        defaults.text_temperature,
        defaults.text_topk,
        defaults.audio_topk,
    )
    assert (s.text_seed, s.audio_seed) == (None, None)
    page.get_by_role("button", name="Disconnect").click()

    page.goto(f"{server.url}/?transport=websocket")
    page.get_by_text("Advanced settings").click()
    expect(page.get_by_label("Text temperature")).to_be_visible()
    expect(note).to_be_hidden()


def through(relay: Any) -> Any:
    """A route handler that puts the page's call through ``relay``: its offer (the form's ``sdp``) and the
    server's answer rewritten, so every datagram of the call takes the relay."""

    def handle(route: Any, request: Any) -> None:
        form = request.post_data
        start = form.index("v=0\r\n")
        end = form.index("\r\n--", start)  # (the form's boundary: no SDP line starts with "--")
        response = route.fetch(post_data=form[:start] + relay.offer(form[start:end]) + form[end:])
        route.fulfill(response=response, body=relay.answer(response.text()))

    return handle


def test_at_5_percent_loss_chromium_sends_fec_and_the_server_rebuilds_lost_packets(speaking_context, start_server):
    """The answer asks for Opus's in-band FEC and the server's reports tell Chromium its losses: through a relay
    that loses 5 % of what it sends, Chromium puts each packet again in the next one, and the server rebuilds
    lost packets from it (``recovered``) rather than making them up (``concealed``)."""
    server = start_server(auth_token=TOKEN)
    kinds = ("recovered", "concealed")
    before = {kind: metric(server, f'pplex_webrtc_packets_total{{kind="{kind}"}}') for kind in kinds}
    with UdpRelay(up=Direction(loss=0.05), seed=6) as relay:
        speaking_context.route("**/v1/realtime/calls", through(relay))
        page = talk(speaking_context, server)
        expect(page.locator("#transport")).to_have_text("Connected over WebRTC")
        wait_stat_above(page, "played", 8.0)
        after = {kind: metric(server, f'pplex_webrtc_packets_total{{kind="{kind}"}}') for kind in kinds}
        dropped = relay.up.rtp_dropped
    made = {kind: after[kind] - before[kind] for kind in kinds}
    print(f"Chromium at 5 % loss: {dropped} packets dropped, {made}")
    assert dropped >= 10
    assert made["recovered"] >= 0.5 * dropped, made
