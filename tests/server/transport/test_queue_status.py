"""``GET /api/queue?ticket=``: the web UI's view of its own place in the queue (the virtual network and clock)."""

from __future__ import annotations

import httpx
import trio

from _helpers.ws import moshi_handshake, moshi_url


async def status(handle, ticket: str | None) -> httpx.Response:
    return await handle.get("/api/queue", params={} if ticket is None else {"ticket": ticket})


async def wait_for_state(handle, ticket: str, state: str) -> dict:
    with trio.fail_after(5):
        while True:
            response = await status(handle, ticket)
            if response.status_code == 200 and response.json()["state"] == state:
                return response.json()
            await trio.sleep(0.02)


async def test_queue_position_by_ticket(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, queue_size=2)
    async with handle.open_websocket(moshi_url(handle.ws_url, ticket="first")) as first:
        await moshi_handshake(first)
        assert await wait_for_state(handle, "first", "live") == {"state": "live", "position": None, "queued": 0}
        async with handle.open_websocket(moshi_url(handle.ws_url, ticket="second", text_prompt="hi")) as second:
            assert await wait_for_state(handle, "second", "queued") == {"state": "queued", "position": 1, "queued": 1}
            async with handle.open_websocket(moshi_url(handle.ws_url, ticket="third")):
                assert (await wait_for_state(handle, "third", "queued"))["position"] == 2
            # The third left: the second is still first in line.
            with trio.fail_after(5):
                while (await status(handle, "third")).status_code != 404:
                    await trio.sleep(0.02)
            assert await wait_for_state(handle, "second", "queued") == {"state": "queued", "position": 1, "queued": 1}
            await first.aclose()
            await moshi_handshake(second)  # the second gets the slot
            assert (await wait_for_state(handle, "second", "live"))["position"] is None


async def test_unknown_missing_and_oversized_tickets(virtual_server, autojump_clock):
    handle = await virtual_server()
    response = await status(handle, "nobody-has-this")
    assert response.status_code == 404 and "no open conversation" in response.json()["error"]
    for bad in (None, "", "x" * 129):
        response = await status(handle, bad)
        assert response.status_code == 400 and "ticket" in response.json()["error"], bad
