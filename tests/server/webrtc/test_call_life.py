"""A WebRTC call's life beside the server's: a network change (a new offer on the same call) keeps the
conversation; client secrets open one call each; the UDP ports come from the configured range, announced at the
configured address; drain waits for the calls, and neither shutdown nor drain leaves a thread or a socket."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import numpy as np
import psutil
import pytest
import trio

from _helpers.aio import run_asyncio
from _helpers.browser import ThreadServer, wait_until
from _helpers.webrtc import RATE, Caller, assert_echoed
from pplex_trio.engine import EchoEngine
from pplex_trio.server import ServerSettings

TOKEN = "s3rver-t0ken-for-webrtc-tests"

# Real time, real sockets and aiortc on both ends in one process: run alone, after the parallel suite (their load
# beside it starved the real-time compat tests on two cores).
pytestmark = pytest.mark.serial


def udp_sockets() -> list[tuple[str, int]]:
    return sorted(tuple(c.laddr) for c in psutil.Process().net_connections(kind="udp"))


def webrtc_threads() -> int:
    """The asyncio loop threads of WebRTC calls alive in this process (other tests' servers have theirs)."""
    return sum(thread.name == "webrtc" for thread in threading.enumerate())


def metric(server, line_start: str) -> float:
    lines = [line for line in server.get_text("/metrics").splitlines() if line.startswith(line_start)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def start(**settings) -> ThreadServer:
    return ThreadServer(
        ServerSettings(host="127.0.0.1", port=0, slots=2, model="echo", **settings), EchoEngine(2)
    ).start()


async def heard(caller: Caller, seconds: float) -> None:
    deadline = time.monotonic() + seconds + 10
    while caller.received().size < seconds * RATE:
        assert time.monotonic() < deadline, f"only {caller.received().size / RATE:.2f} s came back"
        await asyncio.sleep(0.05)


def test_a_new_offer_on_the_same_call_keeps_the_conversation(echo_server, speech, problems):
    """The caller's network changes: it makes a new peer connection and posts its offer to the call's URL. The
    server answers it with a new peer under the same session: the same row, no new session, and what the caller
    says on the new connection comes back on it."""
    started = metric(echo_server, 'pplex_sessions_started_total{protocol="realtime_webrtc"}')

    async def move() -> tuple[Caller, list[dict], list[dict], httpx.Response]:
        first = Caller()
        await first.call(echo_server.url)
        await asyncio.wait_for(first.opened.wait(), 10)
        await heard(first, 1.0)
        before = (await asyncio.to_thread(echo_server.get, "/api/sessions"))["sessions"]
        second = Caller()
        offer = await second.offer()
        async with httpx.AsyncClient(timeout=20, trust_env=False) as http:
            answered = await http.post(
                echo_server.url + first.location, content=offer, headers={"content-type": "application/sdp"}
            )
        await second.answer(answered.text)
        for transceiver in first.pc.getTransceivers():  # (the old network is gone without a word)
            for protocol in transceiver.receiver.transport.transport._connection._protocols:
                protocol.transport.close()
        await asyncio.wait_for(second.opened.wait(), 10)
        second.microphone.say(np.concatenate([np.zeros(RATE // 2, np.float32), speech]))
        await heard(second, 3.5)
        after = (await asyncio.to_thread(echo_server.get, "/api/sessions"))["sessions"]
        await first.close()
        await second.close()
        return second, before, after, answered

    second, before, after, answered = run_asyncio(move())
    assert answered.status_code == 200 and answered.headers["content-type"].startswith("application/sdp")
    assert [row["id"] for row in after] == [row["id"] for row in before] and len(after) == 1
    assert after[0]["frames_sent"] > before[0]["frames_sent"]  # (the same call, further on)
    assert_echoed(speech, second.received())
    assert "session.created" not in {event["type"] for event in second.events}  # (its events go on)
    assert metric(echo_server, 'pplex_sessions_started_total{protocol="realtime_webrtc"}') == started + 1
    wait_until(lambda: echo_server.get("/api/sessions")["sessions"] == [], 10, "the call did not end")
    assert problems == []


@pytest.fixture
def token_server():
    running = start(auth_token=TOKEN)
    try:
        yield running
    finally:
        running.stop()


def test_a_client_secret_opens_one_call_with_its_settings(token_server, problems):
    persona = "You answer in rhymes."
    secret = httpx.post(
        token_server.url + "/v1/realtime/client_secrets",
        json={"session": {"type": "realtime", "instructions": persona}},
        headers={"authorization": f"Bearer {TOKEN}"},
        trust_env=False,
    ).json()["value"]

    async def calls() -> tuple[Caller, int, int]:
        caller, refused = Caller(), [Caller(), Caller()]
        without = await refused[0].call(token_server.url)
        await caller.call(token_server.url, token=secret)
        await asyncio.wait_for(caller.opened.wait(), 10)
        await caller.wait_for("session.created")
        again = await refused[1].call(token_server.url, token=secret)
        for each in (caller, *refused):
            await each.close()
        return caller, without.status_code, again.status_code

    caller, without, again = run_asyncio(calls())
    assert without == 401 and again == 401
    assert caller.of_type("session.created")[0]["session"]["instructions"] == persona
    assert problems == []


def test_the_ports_come_from_the_range_and_the_address_is_announced(problems):
    running = start(webrtc_ports="47310-47311", webrtc_host="127.0.0.1")

    async def calls() -> tuple[list[str], int, str, int]:
        callers = [Caller(), Caller()]
        answers = []
        for caller in callers:
            response = await caller.call(running.url)
            assert response.status_code == 201
            answers.append(response.text)
        refused = Caller()
        third = await refused.call(running.url)
        await refused.close()
        await callers[0].close()
        await asyncio.sleep(1.5)  # (its port is given back once its peer has closed)
        fourth = Caller()
        again = await fourth.call(running.url)
        await fourth.close()
        await callers[1].close()
        return answers, third.status_code, third.json()["error"]["message"], again.status_code

    try:
        answers, third, said, again = run_asyncio(calls())
    finally:
        running.stop()
    for answer in answers:
        candidates = re.findall(r"a=candidate:\S+ \d+ udp \d+ (\S+) (\d+) typ host", answer)
        assert candidates and all(host == "127.0.0.1" and 47310 <= int(port) <= 47311 for host, port in candidates)
    assert third == 503 and "no free UDP port in 47310-47311" in said
    assert again == 201
    assert problems == []


def test_shutdown_with_a_call_up_leaves_no_thread_or_socket(speech, problems):
    sockets, threads = udp_sockets(), webrtc_threads()
    running = start()

    async def call() -> Caller:
        caller = Caller()
        await caller.call(running.url)
        await asyncio.wait_for(caller.opened.wait(), 10)
        await heard(caller, 1.0)
        await asyncio.to_thread(running.stop)
        deadline = time.monotonic() + 5
        while caller.pc.connectionState != "closed" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await caller.close()
        return caller

    caller = run_asyncio(call())
    errors = caller.of_type("error")
    assert errors and errors[-1]["error"]["type"] == "server_error", caller.events[-3:]
    assert webrtc_threads() == threads
    wait_until(lambda: udp_sockets() == sockets, 5, "a UDP socket outlived the server")
    assert problems == []


def test_drain_waits_for_the_call_and_takes_no_new_one(speech, problems):
    sockets, threads = udp_sockets(), webrtc_threads()
    running = start()

    async def call() -> tuple[Caller, int, float]:
        caller = Caller()
        await caller.call(running.url)
        await asyncio.wait_for(caller.opened.wait(), 10)
        draining = threading.Thread(
            target=lambda: trio.from_thread.run(running.handle.drain_then_shutdown, 30, trio_token=running.token)
        )
        draining.start()
        await asyncio.sleep(0.5)
        late = Caller()
        refused = await late.call(running.url)
        await late.close()
        caller.microphone.say(np.concatenate([np.zeros(RATE // 2, np.float32), speech]))
        await heard(caller, 3.5)  # (the call goes on while the server drains)
        hung_up = time.monotonic()
        await caller.close()
        await asyncio.to_thread(draining.join, 20)
        return caller, refused.status_code, time.monotonic() - hung_up

    caller, refused, drained_in = run_asyncio(call())
    assert refused == 503
    assert_echoed(speech, caller.received())
    assert drained_in < 10  # (the drain ended with the call, not at its 30 s)
    running.stop()
    assert webrtc_threads() == threads
    wait_until(lambda: udp_sockets() == sockets, 5, "a UDP socket outlived the server")
    assert problems == []


def test_pages_of_other_origins_by_the_origins_rule(problems):
    """The call routes follow the WebSockets' origin rule: a page of an origin neither the server's own nor in
    ``--allowed-origins`` is refused 403 (its preflight too); an allowed one gets its preflight answered (POST,
    its token and content type: no token needed to ask) and an answer it may read, ``Location`` included."""
    allowed = "https://app.example.com"
    running = start(allowed_origins=allowed, auth_token=TOKEN)

    async def calls() -> tuple[httpx.Response, httpx.Response, httpx.Response, httpx.Response]:
        caller = Caller()
        offer = await caller.offer()
        async with httpx.AsyncClient(timeout=20, trust_env=False) as http:
            url = running.url + "/v1/realtime/calls"
            preflight = {"access-control-request-method": "POST", "access-control-request-headers": "authorization"}
            foreign = await http.options(url, headers={"origin": "https://evil.example", **preflight})
            asked = await http.options(url, headers={"origin": allowed, **preflight})
            headers = {"origin": allowed, "authorization": f"Bearer {TOKEN}", "content-type": "application/sdp"}
            answered = await http.post(url, content=offer, headers=headers)
            foreign_post = await http.post(url, content=offer, headers={**headers, "origin": "https://evil.example"})
        await caller.answer(answered.text)
        await caller.close()
        return foreign, asked, answered, foreign_post

    try:
        foreign, asked, answered, foreign_post = run_asyncio(calls())
    finally:
        running.stop()
    assert foreign.status_code == 403 and foreign_post.status_code == 403
    assert "access-control-allow-origin" not in foreign.headers
    assert asked.status_code == 204 and asked.headers["access-control-allow-origin"] == allowed
    assert "POST" in asked.headers["access-control-allow-methods"]
    assert "authorization" in asked.headers["access-control-allow-headers"]
    assert answered.status_code == 201 and answered.headers["access-control-allow-origin"] == allowed
    assert "Location" in answered.headers["access-control-expose-headers"]
    assert problems == []
