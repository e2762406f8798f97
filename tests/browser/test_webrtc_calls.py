"""Chromium calls each WebRTC endpoint the way OpenAI documents its browser flow: audio both ways (the echo
engine sends the microphone back, found at one lag), every data-channel event valid per the ``openai`` SDK's
types, and a client secret good for one call."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest

from _helpers.rtc_page import CALL_PAGE, echo_lag, tape

openai = pytest.importorskip("openai")
from openai.types.live import ServerEvent as LiveServerEvent  # noqa: E402
from openai.types.realtime import RealtimeServerEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.serial]  # (timing-bound: run alone, after the parallel suite)

REALTIME_EVENT = TypeAdapter(RealtimeServerEvent)
LIVE_EVENT = TypeAdapter(LiveServerEvent)
TOKEN = "browser-webrtc-token"
PERSONA = "You are a patient tutor."


def call_page(context: Any, server: Any, token: str | None = None) -> Any:
    """The test's page, on the server's origin (its requests are then same-origin); ``token``: the page was
    opened once with ``?token=`` and holds the cookie."""
    page = context.new_page()
    page.goto(server.url + (f"/?token={token}" if token else "/health"))
    page.set_content(CALL_PAGE)
    return page


def client_secret(server: Any, session: dict[str, Any]) -> str:
    """An ephemeral key minted with the server's token, as an app's backend does for its page."""
    response = httpx.post(
        server.url + "/v1/realtime/client_secrets",
        json={"session": session},
        headers={"Authorization": f"Bearer {TOKEN}"},
        trust_env=False,
    )
    response.raise_for_status()
    value = response.json()["value"]
    assert value.startswith("ek_")
    return value


def test_openai_browser_flow_realtime(speaking_context, start_server):
    """An ephemeral key from the app's backend, then OpenAI's browser flow with our base URL: the answer, the
    echo, the events valid per the SDK; the same key again is refused."""
    server = start_server(auth_token=TOKEN)
    key = client_secret(server, {"type": "realtime", "instructions": PERSONA})
    page = call_page(speaking_context, server)
    result = page.evaluate("([url, key]) => realtimeCall(url, key, 6)", [server.url + "/v1", key])
    assert result["status"] == 201, result
    assert result["location"].startswith("/v1/realtime/calls/rtc_")
    lag = echo_lag(tape(result["left"]), tape(result["right"]))
    print(f"realtime: echo at {lag * 1000:.0f} ms, {len(result['events'])} events")
    for event in result["events"]:
        REALTIME_EVENT.validate_python(event)
    assert result["events"][0]["type"] == "session.created"
    assert result["events"][0]["session"]["instructions"] == PERSONA

    again = page.evaluate("([url, key]) => realtimeCall(url, key, 1)", [server.url + "/v1", key])
    assert again["status"] == 401, again


def test_openai_browser_flow_live(speaking_context, start_server):
    """The Live API's flow from the page (the offer in ``transport``, the page's cookie for a token): the echo,
    ``session.started`` first with the settings, every event valid per the SDK's Live types."""
    server = start_server(auth_token=TOKEN)
    page = call_page(speaking_context, server, token=TOKEN)
    session = {"model": "gpt-live-1", "instructions": PERSONA}
    result = page.evaluate("([url, session]) => liveCall(url, session, 6)", [server.url + "/v1", session])
    assert result["status"] == 201, result
    assert result["id"].startswith("sess_")
    lag = echo_lag(tape(result["left"]), tape(result["right"]))
    print(f"live: echo at {lag * 1000:.0f} ms, {len(result['events'])} events")
    for event in result["events"]:
        LIVE_EVENT.validate_python(event)
    started = result["events"][0]
    assert started["type"] == "session.started" and started["session"]["id"] == result["id"]
    assert started["session"]["instructions"] == PERSONA


def test_openai_browser_flow_with_the_tiny_model(speaking_context, start_server):
    """The same flow against ``--model tiny`` (a real model on the CPU): its voice comes back on the track once
    the caller speaks, and every event is valid."""
    from pplex_trio._cli._engines import create_engine
    from pplex_trio.server import ServerSettings

    engine = create_engine(ServerSettings(model="tiny", slots=1, device="cpu"))
    server = start_server(engine=engine, slots=1, auth_token=TOKEN)
    key = client_secret(server, {"type": "realtime", "instructions": PERSONA})
    page = call_page(speaking_context, server)
    # (seconds of CPU prefill before the model speaks, beside Chromium on two cores)
    result = page.evaluate("([url, key]) => realtimeCall(url, key, 10)", [server.url + "/v1", key])
    assert result["status"] == 201, result
    heard = tape(result["left"])
    levels = np.sqrt(np.mean(heard[: heard.size // 4800 * 4800].reshape(-1, 4800) ** 2, axis=1))  # per 100 ms
    loud = np.flatnonzero(levels > 0.01) / 10
    kinds = [event["type"] for event in result["events"]]
    print(f"tiny: {loud.size / 10:.1f} s audible of {heard.size / 48000:.1f} s, median level {np.median(levels):.3f}")
    assert loud.size >= 10, f"the model's voice did not come back: {loud.size / 10:.1f} s audible"
    for event in result["events"]:
        REALTIME_EVENT.validate_python(event)
    assert kinds[0] == "session.created" and "response.created" in kinds


def test_the_live_flow_with_the_tiny_model(speaking_context, start_server):
    """``POST /v1/live/sessions`` from the page against ``--model tiny``: ``session.started`` once live, the
    model's voice on the track, every event valid per the SDK's Live types."""
    from pplex_trio._cli._engines import create_engine
    from pplex_trio.server import ServerSettings

    engine = create_engine(ServerSettings(model="tiny", slots=1, device="cpu"))
    server = start_server(engine=engine, slots=1, auth_token=TOKEN)
    page = call_page(speaking_context, server, token=TOKEN)
    session = {"model": "gpt-live-1", "instructions": PERSONA}
    result = page.evaluate("([url, session]) => liveCall(url, session, 10)", [server.url + "/v1", session])
    assert result["status"] == 201, result
    heard = tape(result["left"])
    levels = np.sqrt(np.mean(heard[: heard.size // 4800 * 4800].reshape(-1, 4800) ** 2, axis=1))  # per 100 ms
    assert np.count_nonzero(levels > 0.01) >= 10, "the model's voice did not come back"
    for event in result["events"]:
        LIVE_EVENT.validate_python(event)
    assert result["events"][0]["type"] == "session.started"
