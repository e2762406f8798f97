"""Floods of resume attempts (virtual network and clock, the echo engine): each wrong token gets its 1008, one of
many resumes of the same paused call wins and the rest get theirs, and nothing else is touched: a live call keeps
every frame, the metrics count every attempt, and the log has no traceback and at most a line an attempt."""

from __future__ import annotations

import json
import logging
import secrets

import trio

from _helpers.ws import read_until_closed
from tests.server.sessions.test_resume import PATH, echoed, frame, open_call, slots, talk

WRONG = 60  # connections presenting made-up tokens
SAME = 12  # connections presenting the paused call's one valid token, at once


async def _attempt(handle, token: str, results: list) -> None:
    """One connection presenting ``token``: ("ready", the connection kept open) or (close code, reason)."""
    async with handle.open_websocket(PATH) as ws:
        await ws.send_message(json.dumps({"type": "open", "resume": token}))
        message = json.loads(await ws.get_message())
        if message["type"] == "ready":
            results.append(("ready", message))
            await ws.send_message(frame(0.4))
            await echoed(ws.get_message, 0.4)
            await ws.send_message(json.dumps({"type": "close"}))
        closed = await read_until_closed(ws)
        if message["type"] != "ready":
            results.append((closed.code, closed.reason))


async def test_a_flood_of_resumes_is_refused_one_by_one_and_touches_nothing_else(
    virtual_server, autojump_clock, nursery, caplog
):
    handle = await virtual_server(slots=2, prefill_steps=1)
    witness, done = await handle.start_witness(nursery)
    bad, ready = await open_call(handle)
    await talk(bad, [0.2])
    bad.reset()  # the call to resume: paused
    await trio.sleep(0.5)
    before = len(caplog.records)
    results: list = []
    with caplog.at_level(logging.INFO):
        async with trio.open_nursery() as flood:
            for _ in range(WRONG):
                flood.start_soon(_attempt, handle, secrets.token_urlsafe(24), results)
            for _ in range(SAME):
                flood.start_soon(_attempt, handle, ready["resume"], results)
    refused = [r for r in results if r[0] != "ready"]
    won = [r for r in results if r[0] == "ready"]
    assert len(won) == 1 and won[0][1]["resumed"] is True  # the first valid resume wins
    assert len(refused) == WRONG + SAME - 1
    assert all(code == 1008 and "unknown, used or expired" in reason for code, reason in refused)
    counts = await handle.resumes()
    assert counts == {"resumed": 1, "expired": 0, "refused": 0, "wrong_token": WRONG + SAME - 1}
    flood_log = caplog.records[before:]
    assert not [r for r in flood_log if r.exc_info or r.levelno >= logging.WARNING]
    # One line an attempt, as for any connection (its session's end), none of them about the resume itself.
    lines = [r.getMessage() for r in flood_log]
    assert len([line for line in lines if line.endswith("ended: bad_request")]) == WRONG + SAME - 1
    assert len(lines) <= WRONG + SAME + 2, lines[-5:]
    await trio.sleep(0.5)
    witness.stop.set()
    with trio.fail_after(5):
        await done.wait()
    witness.check()  # the live call got every frame back, in order
    await trio.sleep(3)  # (the return window a closed call's slot waits for its client)
    assert (await slots(handle))["free"] == 2  # the resumed call closed: nothing is left held
