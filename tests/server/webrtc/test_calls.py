"""A WebRTC call to each endpoint, from aiortc through the ``openai`` SDK's own requests: audio both ways (the
caller hears its own words back, whole and in time) and every event on the data channel valid per the SDK's
types; the call ends when the caller hangs up, its row and its peer with it."""

from __future__ import annotations

import asyncio
import re
import time

import numpy as np
import pytest

from _helpers.aio import run_asyncio
from _helpers.webrtc import RATE, Caller, assert_echoed

openai = pytest.importorskip("openai")
from openai.types.live import LiveCreateResponse  # noqa: E402
from openai.types.live import ServerEvent as LiveServerEvent  # noqa: E402
from openai.types.realtime import RealtimeServerEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

REALTIME_EVENT = TypeAdapter(RealtimeServerEvent)
LIVE_EVENT = TypeAdapter(LiveServerEvent)
PERSONA = "You are a patient tutor."

# Real time, real sockets and aiortc on both ends in one process: run alone, after the parallel suite (their load
# beside it starved the real-time compat tests on two cores).
pytestmark = pytest.mark.serial


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0)


def metric(server, line_start: str) -> float:
    lines = [line for line in server.get_text("/metrics").splitlines() if line.startswith(line_start)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


async def converse(caller: Caller, speech: np.ndarray, *, heard_seconds: float) -> None:
    """Say ``speech`` after half a second of silence, and listen until ``heard_seconds`` of audio came back."""
    await asyncio.wait_for(caller.opened.wait(), 10)
    caller.microphone.say(np.concatenate([np.zeros(RATE // 2, np.float32), speech]))
    deadline = time.monotonic() + heard_seconds + 10
    while caller.received().size < heard_seconds * RATE:
        assert time.monotonic() < deadline, f"only {caller.received().size / RATE:.2f} s of audio came back"
        await asyncio.sleep(0.05)


def test_a_realtime_call_through_the_sdk(echo_server, speech, problems):
    """``client.realtime.calls.create`` (OpenAI's multipart form, with the session's settings): the answer and
    ``Location``; the events on ``oai-events`` are the Realtime WebSocket's (none carries audio: it is on the
    track), the echo comes back, and hanging up ends the session."""
    ended = metric(echo_server, 'pplex_webrtc_calls_ended_total{reason="peer_closed"}')

    async def call() -> tuple[Caller, str, list[dict]]:
        caller = Caller()
        offer = await caller.offer()
        session = {"type": "realtime", "instructions": PERSONA}
        response = await asyncio.to_thread(sdk(echo_server).realtime.calls.create, sdp=offer, session=session)
        await caller.answer(response.text)
        await converse(caller, speech, heard_seconds=4.0)
        rows = await asyncio.to_thread(echo_server.get, "/api/sessions")
        await caller.close()
        return caller, response.response.headers["location"], rows["sessions"]

    caller, location, rows = run_asyncio(call())
    assert re.fullmatch(r"/v1/realtime/calls/rtc_[0-9a-f]{24}", location)
    assert [row["protocol"] for row in rows] == ["realtime_webrtc"]
    for event in caller.events:
        REALTIME_EVENT.validate_python(event)
    assert caller.events[0]["type"] == "session.created"
    assert caller.events[0]["session"]["instructions"] == PERSONA
    kinds = {event["type"] for event in caller.events}
    assert {"response.created", "input_audio_buffer.speech_started"} <= kinds
    assert "response.output_audio.delta" not in kinds  # (the voice is on the track)
    assert_echoed(speech, caller.received())
    wait_until(lambda: echo_server.get("/api/sessions")["sessions"] == [])
    wait_until(lambda: metric(echo_server, 'pplex_webrtc_calls_ended_total{reason="peer_closed"}') == ended + 1)
    assert metric(echo_server, 'pplex_webrtc_packets_total{kind="received"}') > 100
    assert problems == []


def test_a_live_call_through_the_sdk(echo_server, speech, problems):
    """``client.live.create`` with the offer in ``transport``: the SDK's ``LiveCreateResponse``; on the channel
    ``session.started`` first (with the settings), then Live's events, each valid; the echo comes back; the
    hang-up route ends it."""

    async def call() -> tuple[Caller, LiveCreateResponse, int]:
        caller = Caller()
        offer = await caller.offer()
        created = await asyncio.to_thread(
            sdk(echo_server).live.create,
            session={"model": "gpt-live-1", "instructions": PERSONA},
            transport={"type": "webrtc", "sdp": offer},
        )
        await caller.answer(created.transport.sdp)
        await converse(caller, speech, heard_seconds=4.0)
        hangup = await asyncio.to_thread(
            sdk(echo_server).post, f"/live/sessions/{created.session.id}/hangup", cast_to=object
        )
        assert hangup == {}
        await asyncio.sleep(1)
        state = caller.pc.connectionState
        await caller.close()
        return caller, created, state

    caller, created, state = run_asyncio(call())
    assert re.fullmatch(r"sess_[0-9a-f]{24}", created.session.id) and created.transport.type == "webrtc"
    for event in caller.events:
        LIVE_EVENT.validate_python(event)
    started = caller.events[0]
    assert started["type"] == "session.started" and started["session"]["instructions"] == PERSONA
    assert started["session"]["id"] == created.session.id
    assert "session.output_audio.delta" not in {event["type"] for event in caller.events}
    assert_echoed(speech, caller.received())
    assert state == "closed"  # (the server closed the peer connection when the call was hung up)
    wait_until(lambda: echo_server.get("/api/sessions")["sessions"] == [])
    assert metric(echo_server, 'pplex_webrtc_calls_ended_total{reason="hangup"}') >= 1
    assert problems == []


def test_a_raw_sdp_offer_and_a_second_call_beside_it(echo_server, speech):
    """``application/sdp`` alone (OpenAI's browser flow) answers too, and two calls at once each hear their own."""

    async def call() -> list[Caller]:
        callers = [Caller(), Caller()]
        for caller in callers:
            response = await caller.call(echo_server.url)
            assert response.status_code == 201 and response.headers["content-type"].startswith("application/sdp")
        quiet = np.zeros_like(speech)
        await asyncio.gather(
            converse(callers[0], speech, heard_seconds=4.0), converse(callers[1], quiet, heard_seconds=4.0)
        )
        for caller in callers:
            await caller.close()
        return callers

    first, second = run_asyncio(call())
    assert_echoed(speech, first.received())
    assert np.abs(second.received()).max() < 0.01  # (the other caller said nothing, and heard nothing of it)


def wait_until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
