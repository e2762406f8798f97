"""``GET /api/status`` and ``/status``: the status page's figures, on the virtual network and clock."""

from __future__ import annotations

import math

import pytest
import trio

from _helpers.ws import moshi_handshake, moshi_url
from pplex_trio.server._status import HISTORY_SECONDS, PERSONA_CHARS, quantile

TOKEN = "tok-status-5e1d"
PERSONA = "You are a patient tutor who explains the status page. " * 4  # longer than the page shows


def test_quantiles_interpolate_within_a_bucket_as_prometheus_does():
    bounds = [0.001, 0.002, 0.005, math.inf]
    assert quantile(0.5, bounds, [0, 0, 0, 0]) is None  # no tick this second
    assert quantile(0.5, bounds, [10, 10, 10, 10]) == pytest.approx(0.0005)  # the first bucket starts at 0
    assert quantile(0.5, bounds, [0, 4, 8, 8]) == pytest.approx(0.002)  # rank 4: the top of the second bucket
    assert quantile(0.75, bounds, [0, 4, 8, 8]) == pytest.approx(0.0035)  # halfway through the third
    assert quantile(0.99, bounds, [0, 0, 1, 2]) == pytest.approx(0.005)  # in +Inf: the highest finite bound


def metric(text: str, name: str) -> float:
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


async def test_a_live_conversation_and_one_point_of_history_a_second(virtual_server, autojump_clock):
    handle = await virtual_server(slots=2, compute_seconds=0.007)  # each engine call: 7 ms of virtual time
    before = await handle.get_json("/api/status")
    assert before["slots"] == {"free": 2, "prefill": 0, "live": 0, "draining": 0, "held": 0}
    assert before["sessions"] == [] and before["queued"] == 0
    assert before["gpu_memory"] is None  # the echo engine runs on no GPU
    url = moshi_url(handle.ws_url, text_prompt=PERSONA, voice_prompt="NATF0.pt")
    async with handle.open_websocket(url) as ws:
        await moshi_handshake(ws)
        await trio.sleep(1.0)  # (the history's seconds from here on all have the conversation live)
        count0 = metric(await handle.metrics(), "pplex_tick_lateness_seconds_count")
        points0 = len((await handle.get_json("/api/status"))["history"]["t"])
        await trio.sleep(10.0)
        status = await handle.get_json("/api/status")
        count1 = metric(await handle.metrics(), "pplex_tick_lateness_seconds_count")
    (session,) = status["sessions"]
    assert session["protocol"] == "moshi" and session["state"] == "live"
    assert session["persona"] == PERSONA[:PERSONA_CHARS] and session["voice"] == "NATF0.pt"
    assert 11.0 <= session["age_s"] <= 12.0
    assert set(session["quality"]) == {"response_latency_ms", "talk_over_s", "dead_air_s", "agent_share", "barge_ins"}
    assert session["quality"]["agent_share"] == 0.0  # (a client that never spoke: its echo is silent too)
    assert status["slots"]["live"] == 1 and status["slots"]["free"] == 1

    history = status["history"]
    assert len(history["t"]) - points0 == 10  # one point a second
    assert history["t"] == sorted(history["t"]) and -1.0 <= history["t"][-1] <= 0
    last = {name: values[-10:] for name, values in history.items() if isinstance(values, list)}
    assert last["live"] == [1] * 10
    assert all(12 <= ticks <= 13 for ticks in last["ticks"]), last["ticks"]  # 80 ms ticks: 12.5 a second
    assert sum(last["ticks"]) == count1 - count0  # the same ticks /metrics counted
    # Every tick's engine call took 7 ms: its bucket is (5, 10] ms, and its quantiles fall inside it.
    assert all(5.0 < ms <= 10.0 for ms in last["engine_p50_ms"] + last["engine_p99_ms"]), last
    # On the virtual clock a tick is on time: every lateness is in the first bucket, (0, 0.5] ms.
    assert all(0 < ms <= 0.5 for ms in last["lateness_p50_ms"] + last["lateness_p99_ms"]), last


async def test_the_history_keeps_five_minutes(virtual_server, autojump_clock):
    handle = await virtual_server()
    await trio.sleep(HISTORY_SECONDS + 30)
    history = (await handle.get_json("/api/status"))["history"]
    assert len(history["t"]) == HISTORY_SECONDS and history["t"][0] >= -HISTORY_SECONDS
    assert set(history["ticks"]) == {0} and set(history["engine_p99_ms"]) == {None}  # no conversation: no tick


async def test_the_page_and_its_figures_need_the_token(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    async with handle.http() as http:
        for path in ("/status", "/api/status"):
            assert (await http.get(path)).status_code == 401, path
            assert (await http.get(path, params={"token": "wrong"})).status_code == 401, path
            bearer = await http.get(path, headers={"authorization": f"Bearer {TOKEN}"})
            assert bearer.status_code == 200, path
        browser = {"accept": "text/html"}
        assert "token" in (await http.get("/status", headers=browser)).text  # the form that asks for it
        # Opened with the token: the cookie, and the token out of the address bar.
        page = await http.get("/status", params={"token": TOKEN}, headers=browser)
        assert page.status_code == 303 and page.headers["location"] == "/status"
        assert (await http.get("/status", headers=browser)).status_code == 200  # with the cookie
        assert "/api/status" in (await http.get("/js/status.js")).text
        assert (await http.get("/api/status")).json()["slots_total"] == 2
