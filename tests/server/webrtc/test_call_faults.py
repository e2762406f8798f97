"""WebRTC calls that go wrong: bad offers and bad settings (refused before any peer connection, with OpenAI's error
body), a caller that vanishes (consent expires), one that floods its data channel, calls that do not exist; each
ends with a reason in the log and in ``/metrics``, never a traceback, and never hurts the call beside it."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time

import aioice.ice
import httpx
import numpy as np
import pytest

from _helpers.aio import run_asyncio
from _helpers.browser import wait_until
from _helpers.webrtc import RATE, Caller, assert_echoed

OFFER_HEAD = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
AUDIO = "m=audio 9 UDP/TLS/RTP/SAVPF {pts}\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendrecv\r\n"
ICE = "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuv\r\na=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\n"


async def an_offer() -> str:
    """A real caller's offer (aiortc's), its peer closed again."""
    caller = Caller()
    offer = await caller.offer()
    await caller.close()
    return offer


# Real time, real sockets and aiortc on both ends in one process: run alone, after the parallel suite (their load
# beside it starved the real-time compat tests on two cores).
pytestmark = pytest.mark.serial


def post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, timeout=10, trust_env=False, **kwargs)


def metric(server, line_start: str) -> float:
    lines = [line for line in server.get_text("/metrics").splitlines() if line.startswith(line_start)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


@pytest.mark.parametrize(
    "body, said",
    [
        (b"hello", "not an SDP offer"),
        (b"\xff\xfe", "not UTF-8"),
        ((OFFER_HEAD + "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n").encode(), "no audio"),
        ((OFFER_HEAD + AUDIO.format(pts=0) + ICE + "a=rtpmap:0 PCMU/8000\r\n").encode(), "Opus"),
        ((OFFER_HEAD + AUDIO.format(pts=111) + "a=rtpmap:111 opus/48000/2\r\n").encode(), "not a WebRTC offer"),
    ],
    ids=["not-sdp", "not-utf8", "no-audio", "pcmu-only", "no-ice"],
)
def test_a_bad_offer_is_refused_before_any_peer(echo_server, problems, body, said):
    before = echo_server.get("/health")["sessions"]
    for path in ("/v1/realtime/calls",):
        response = post(echo_server, path, content=body, headers={"content-type": "application/sdp"})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert said in error["message"] and error["type"] == "invalid_request_error"
    live = post(echo_server, "/v1/live/sessions", json={"transport": {"type": "webrtc", "sdp": body.decode("latin-1")}})
    assert live.status_code == 400
    assert echo_server.get("/health")["sessions"] == before
    assert problems == []


def test_bad_settings_and_bodies_are_refused(echo_server, problems):
    calls = "/v1/realtime/calls"
    no_sdp = post(echo_server, calls, files={"session": (None, "{}")})
    assert no_sdp.status_code == 400 and no_sdp.json()["error"]["param"] == "sdp"
    bad_json = post(echo_server, calls, files={"sdp": (None, "v=0"), "session": (None, "{")})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["param"] == "session"
    long = {"type": "realtime", "instructions": "x" * 100_000}
    too_long = post(echo_server, calls, files={"sdp": (None, "v=0"), "session": (None, json.dumps(long))})
    assert too_long.status_code in (400, 413)
    for body in ({}, {"transport": {"type": "websocket"}}, {"transport": {"type": "webrtc"}}, []):
        live = post(echo_server, "/v1/live/sessions", json=body)
        assert live.status_code == 400 and "transport" in live.json()["error"]["message"] or body == []
    assert post(echo_server, "/v1/live/sessions", content=b"{").status_code == 400
    assert problems == []


def test_calls_that_do_not_exist(echo_server, problems):
    for path in ("/v1/realtime/calls/rtc_0000/hangup", "/v1/live/sessions/sess_0000/hangup"):
        response = post(echo_server, path)
        assert response.status_code == 404 and response.json()["error"]["code"] == "call_not_found"

    offer = run_asyncio(an_offer())
    again = post(echo_server, "/v1/realtime/calls/rtc_0000", content=offer, headers={"content-type": "application/sdp"})
    assert again.status_code == 404
    assert problems == []


def test_a_caller_that_vanishes_is_ended_when_its_consent_expires(echo_server, problems, monkeypatch):
    """The caller's network goes (its sockets close without a word): the server's consent checks (RFC 7675)
    go unanswered and the call ends, reason ``consent_expired``. (The checks' interval is cut from aioice's 5 s
    so that this takes seconds, not half a minute.)"""
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.2)
    expired = metric(echo_server, 'pplex_webrtc_calls_ended_total{reason="consent_expired"}')

    async def vanish() -> None:
        caller = Caller()
        await caller.call(echo_server.url)
        await asyncio.wait_for(caller.opened.wait(), 10)
        await asyncio.sleep(0.5)
        for transceiver in caller.pc.getTransceivers():  # (the network is gone: nothing leaves, nothing arrives)
            for protocol in transceiver.receiver.transport.transport._connection._protocols:
                protocol.transport.close()
        await asyncio.sleep(0.2)
        await caller.close()

    run_asyncio(vanish())
    wait_until(
        lambda: metric(echo_server, 'pplex_webrtc_calls_ended_total{reason="consent_expired"}') == expired + 1,
        15,
        "the vanished caller's call did not end",
    )
    wait_until(lambda: echo_server.get("/api/sessions")["sessions"] == [], 5, "its session is still up")
    assert problems == []


def test_a_flooded_data_channel_ends_that_call_only(echo_server, speech, problems):
    """Thousands of events at once: the flooding call is told why (an ``error`` event) and ended; the call beside
    it goes on hearing its echo."""
    ended = metric(echo_server, 'pplex_sessions_ended_total{outcome="protocol_error",protocol="realtime_webrtc"}')

    async def flood() -> tuple[Caller, Caller, str]:
        flooder, neighbour = Caller(), Caller()
        for caller in (flooder, neighbour):
            await caller.call(echo_server.url)
            await asyncio.wait_for(caller.opened.wait(), 10)
        neighbour.microphone.say(np.concatenate([np.zeros(RATE // 2, np.float32), speech]))
        for _ in range(3000):
            flooder.send({"type": "input_audio_buffer.clear"})
        deadline = time.monotonic() + 10
        while flooder.pc.connectionState != "closed" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        state = flooder.pc.connectionState
        while neighbour.received().size < 3.5 * RATE:
            await asyncio.sleep(0.05)
        for caller in (flooder, neighbour):
            await caller.close()
        return flooder, neighbour, state

    flooder, neighbour, state = run_asyncio(flood())
    assert state == "closed"  # (the server closed the flooding call)
    errors = flooder.of_type("error")
    assert errors and any("slow down" in e["error"]["message"] for e in errors), errors[-1:]
    assert_echoed(speech, neighbour.received())
    wait_until(
        lambda: (
            metric(echo_server, 'pplex_sessions_ended_total{outcome="protocol_error",protocol="realtime_webrtc"}')
            == ended + 1
        ),
        5,
        "the flooding call did not end as a protocol error",
    )
    assert problems == []


@pytest.fixture
def impatient_server():
    """The echo server with a 2 s opening timeout: a call whose network never comes up is given up in 2 s."""
    from _helpers.browser import ThreadServer
    from pplex_trio.engine import EchoEngine
    from pplex_trio.server import ServerSettings

    settings = ServerSettings(host="127.0.0.1", port=0, slots=2, model="echo", open_timeout=2)
    running = ThreadServer(settings, EchoEngine(2)).start()
    try:
        yield running
    finally:
        running.stop()


def test_a_call_whose_network_never_comes_up_ends_as_an_ice_failure(impatient_server, problems):
    """The caller posts its offer and never takes the answer: no ICE path; the session gives up on its opening
    and the call ends, reason ``ice_failed``."""

    async def stranded() -> int:
        caller = Caller()
        response = await caller.call(impatient_server.url, apply=False)
        await asyncio.sleep(3)
        await caller.close()
        return response.status_code

    assert run_asyncio(stranded()) == 201
    wait_until(
        lambda: metric(impatient_server, 'pplex_webrtc_calls_ended_total{reason="ice_failed"}') == 1,
        5,
        "the stranded call did not end as an ICE failure",
    )
    wait_until(lambda: impatient_server.get("/api/sessions")["sessions"] == [], 5, "its session is still up")
    assert problems == []


def test_a_caller_whose_certificate_is_not_the_offers_ends_as_a_dtls_failure(impatient_server, problems):
    """ICE works but the caller's DTLS certificate is not the one its offer's fingerprint names (a man in the
    middle, say): the handshake fails, reason ``dtls_failed``."""

    async def forged() -> int:
        caller = Caller()
        offer = await caller.offer()
        fingerprint = re.search(r"a=fingerprint:sha-256 (\S+)", offer).group(1)
        wrong = ":".join("00" if part != "00" else "11" for part in fingerprint.split(":"))
        response = await caller.call(impatient_server.url, offer=offer.replace(fingerprint, wrong))
        await asyncio.sleep(3)
        await caller.close()
        return response.status_code

    assert run_asyncio(forged()) == 201
    wait_until(
        lambda: metric(impatient_server, 'pplex_webrtc_calls_ended_total{reason="dtls_failed"}') == 1,
        5,
        "the forged call did not end as a DTLS failure",
    )
    assert problems == []


def test_without_the_webrtc_extra_a_call_is_refused_501(echo_server, monkeypatch, problems):
    """A server installed without ``pplex-trio[webrtc]`` (no aiortc) answers an offer 501, saying what to
    install (our page then takes the WebSocket); the rest of the server is unaffected."""

    offer = run_asyncio(an_offer())
    monkeypatch.setitem(sys.modules, "pplex_trio.server.webrtc._socket", None)  # (as if aiortc were missing)
    response = post(echo_server, "/v1/realtime/calls", content=offer, headers={"content-type": "application/sdp"})
    assert response.status_code == 501 and "pplex-trio[webrtc]" in response.json()["error"]["message"]
    assert echo_server.get("/health")["status"] == "ok"
    assert problems == []
