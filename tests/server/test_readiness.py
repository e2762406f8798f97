"""Readiness and drain: what a load balancer needs from one replica.

``/ready`` says whether the server can take a conversation now; with
``--refuse-busy-upgrades`` a conversation it cannot take is answered 503
before the upgrade (so a balancer tries another replica); a drain refuses new
conversations while the live ones go on.

The real server on the virtual network and clock; the real command (signals
to its process group, the encoder child) over real sockets at the end.
"""

import json
import os
import signal
import time

import httpx
import numpy as np
import pytest
import trio
import trio.testing

from _helpers.process import start_serve
from _helpers.ws import FRAME, moshi_handshake, moshi_url, raw_open, read_until_closed
from pplex_trio.client import Refused, open_websocket

DUPLEX = "/v1/audio/duplex"


async def ready(handle) -> tuple[int, dict]:
    response = await handle.get("/ready")
    return response.status_code, response.json()


async def refused_upgrade(url: str, opener=open_websocket) -> Refused:
    with pytest.raises(Refused) as caught:
        async with opener(url):
            pass
    return caught.value


async def test_ready_while_a_slot_or_a_queue_place_is_free(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, queue_size=1)
    status, body = await ready(handle)
    assert status == 200 and body["ready"] is True and body["slots_free"] == 1
    async with handle.open_websocket(handle.ws_url + DUPLEX) as first:
        await raw_open(first)
        assert (await ready(handle))[0] == 200  # the queue place is still free
        async with handle.open_websocket(handle.ws_url + DUPLEX) as second:
            await second.send_message(json.dumps({"type": "open"}))
            with trio.fail_after(5):
                while (await ready(handle))[0] != 503:  # the second one has taken the queue place
                    await trio.sleep(0.01)
            status, body = await ready(handle)
            assert body["reason"] == "full" and "taken" in body["message"]
    with trio.fail_after(5):
        while (await ready(handle))[0] != 200:  # both gone: free again (the slot drains first)
            await trio.sleep(0.01)


async def test_health_and_ready_count_a_slot_held_for_a_returning_client_as_held(virtual_server, autojump_clock):
    """A client leaves while another waits: its slot is held for it a moment (it may come back to change its
    persona), and /health and /ready agree that it is held, not free; then it goes to the one waiting.  (Its call is
    not paused for a resume, resume_seconds=0: a paused one counts as held too, see test_resume.py.)"""
    handle = await virtual_server(slots=1, queue_size=1, resume_seconds=0)
    async with handle.open_websocket(handle.ws_url + DUPLEX, source="10.0.0.2") as waiting_client:
        async with handle.open_websocket(handle.ws_url + DUPLEX, source="10.0.0.1") as first:
            await raw_open(first)
            await waiting_client.send_message(json.dumps({"type": "open"}))
            with trio.fail_after(5):
                while (await handle.get_json("/health"))["queued"] != 1:
                    await trio.sleep(0.01)
        left = trio.current_time()
        with trio.fail_after(1):
            while (health := await handle.get_json("/health"))["slots"]["held"] != 1:
                await trio.sleep(0.01)
        assert health["slots"] == {"free": 0, "prefill": 0, "live": 0, "draining": 0, "held": 1}
        assert health["slots_free"] == 0 and (await ready(handle))[1]["slots_free"] == 0
        with trio.fail_after(5):  # the hold lapses: the one waiting gets the slot
            while json.loads(await waiting_client.get_message())["type"] != "ready":
                pass
        assert trio.current_time() - left == pytest.approx(2.0, abs=0.1)
        assert (await handle.get_json("/health"))["slots"]["live"] == 1


async def test_ready_needs_no_token(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token="a-long-test-token")
    assert (await ready(handle))[0] == 200  # a probe carries no token
    assert (await handle.get("/api/info")).status_code == 401


@pytest.mark.parametrize("path", [DUPLEX, "/api/chat", "/v1/realtime"])
async def test_a_full_server_refuses_the_upgrade_with_503_when_asked_to(virtual_server, autojump_clock, path):
    handle = await virtual_server(slots=1, queue_size=0, refuse_busy_upgrades=True)
    async with handle.open_websocket(handle.ws_url + DUPLEX) as first:
        await raw_open(first)
        refusal = await refused_upgrade(handle.ws_url + path, handle.open_websocket)
        assert refusal.status == 503 and "slot" in str(refusal)
        await first.send_message(np.zeros(FRAME, np.float32).tobytes())  # the live one is untouched
        with trio.fail_after(5):
            while not isinstance(await first.get_message(), bytes):
                pass
    metrics = await handle.metrics()
    assert 'pplex_refused_total{reason="full"} 1.0' in metrics


async def test_the_refusal_carries_retry_after(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, queue_size=0, refuse_busy_upgrades=True)
    async with handle.open_websocket(handle.ws_url + DUPLEX) as first:
        await raw_open(first)
        headers = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        }
        async with handle.http() as client:
            response = await client.get(DUPLEX, headers=headers)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert "taken" in response.json()["error"]


async def test_without_the_flag_a_full_server_accepts_and_closes_with_1013(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, queue_size=0)
    async with handle.open_websocket(handle.ws_url + DUPLEX) as first:
        await raw_open(first)
        async with handle.open_websocket(handle.ws_url + DUPLEX) as second:
            await second.send_message(json.dumps({"type": "open"}))
            closed = await read_until_closed(second, timeout=2)
    assert closed.code == 1013  # a browser can show this reason; an HTTP 503 it cannot


async def test_drain_refuses_new_conversations_and_lets_the_live_one_finish(virtual_server, autojump_clock, nursery):
    handle = await virtual_server(slots=2, refuse_busy_upgrades=True)
    async with handle.open_websocket(handle.ws_url + DUPLEX) as live:
        await raw_open(live)
        drained = trio.Event()

        async def drain():
            await handle.drain_then_shutdown(30)
            drained.set()

        nursery.start_soon(drain)
        await trio.testing.wait_all_tasks_blocked()  # (the drain has begun)
        status, body = await ready(handle)
        assert status == 503 and body["reason"] == "draining"
        assert (await refused_upgrade(moshi_url(handle.ws_url), handle.open_websocket)).status == 503
        for _ in range(3):  # the live conversation goes on: audio still flows both ways
            await live.send_message(np.zeros(FRAME, np.float32).tobytes())
        with trio.fail_after(5):
            while not isinstance(await live.get_message(), bytes):
                pass
        assert not drained.is_set()
    with trio.fail_after(0.1):  # the last conversation ended: the drain is over at its next look (every 50 ms)
        await drained.wait()


def unready_series(metrics: str) -> dict[str, float]:
    return {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("pplex_unready{")
    }


async def test_the_unready_gauge_says_what_ready_says(virtual_server, autojump_clock, nursery):
    """``pplex_unready{reason}``: the alert rules' view of /ready (deploy/prometheus/alerts.yml)."""
    handle = await virtual_server(slots=1, queue_size=0)
    assert unready_series(await handle.metrics()) == dict.fromkeys(
        ("shutting_down", "draining", "engine_stalled", "full"), 0.0
    )
    async with handle.open_websocket(handle.ws_url + DUPLEX) as live:
        await raw_open(live)
        assert unready_series(await handle.metrics())["full"] == 1.0
        nursery.start_soon(handle.drain_then_shutdown, 30)
        await trio.testing.wait_all_tasks_blocked()
        series = unready_series(await handle.metrics())
        assert series["draining"] == 1.0 and sum(series.values()) == 1.0


async def test_without_the_flag_a_draining_server_closes_new_conversations_with_1001(
    virtual_server, autojump_clock, nursery
):
    handle = await virtual_server(slots=2)
    async with handle.open_websocket(handle.ws_url + DUPLEX) as live:
        await raw_open(live)
        nursery.start_soon(handle.drain_then_shutdown, 30)
        await trio.testing.wait_all_tasks_blocked()  # (the drain has begun)
        async with handle.open_websocket(handle.ws_url + DUPLEX) as late:
            closed = await read_until_closed(late, timeout=2)
        assert closed.code == 1001 and "draining" in closed.reason


async def test_a_drain_that_runs_out_closes_the_live_ones_with_1001(virtual_server, autojump_clock, nursery):
    handle = await virtual_server(slots=1, shutdown_grace=1.0)
    async with handle.open_websocket(handle.ws_url + DUPLEX) as live:
        await raw_open(live)
        started = trio.current_time()
        nursery.start_soon(handle.drain_then_shutdown, 0.5)
        closed = await read_until_closed(live, timeout=5)
    assert closed.code == 1001
    assert trio.current_time() - started == pytest.approx(0.5)  # when the drain ran out: not before, not later


def test_sigterm_to_the_whole_service_drains_then_exits_0():
    """The real command, as systemd stops it (SIGTERM to every process of the group): drain, then exit."""
    proc, port, _ = start_serve(
        "--model", "echo:prompt=1", "--slots", "2", "--drain-seconds", "30", "--refuse-busy-upgrades", new_session=True
    )
    try:
        base = f"127.0.0.1:{port}"

        async def talk():
            async with open_websocket(f"ws://{base}/api/chat") as live:
                await moshi_handshake(live)
                os.killpg(proc.pid, signal.SIGTERM)
                async with httpx.AsyncClient() as client:
                    with trio.fail_after(5):
                        while (await client.get(f"http://{base}/ready")).status_code != 503:
                            await trio.sleep(0.02)
                assert (await refused_upgrade(f"ws://{base}/api/chat")).status == 503
                audio = 0
                with trio.fail_after(5):  # Opus pages keep coming: the encoder child is still there
                    while audio < 15:
                        audio += (await live.get_message())[:1] == b"\x01"
            return trio.current_time()

        closed_at = trio.run(talk)
        assert proc.wait(timeout=10) == 0  # the last conversation ended, so the drain did too
        assert time.monotonic() - closed_at < 10
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()


def test_a_second_sigterm_ends_the_drain():
    proc, port, _ = start_serve("--model", "echo:prompt=1", "--drain-seconds", "60")
    try:
        base = f"127.0.0.1:{port}"

        async def talk():
            async with open_websocket(f"ws://{base}{DUPLEX}") as live:
                await raw_open(live)
                proc.send_signal(signal.SIGTERM)
                async with httpx.AsyncClient() as client:
                    with trio.fail_after(5):
                        while (await client.get(f"http://{base}/ready")).status_code != 503:
                            await trio.sleep(0.02)
                proc.send_signal(signal.SIGTERM)  # not 60 s more: close now, telling why
                return await read_until_closed(live, timeout=3)

        closed = trio.run(talk)
        assert closed.code == 1001 and "shutting down" in closed.reason
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
