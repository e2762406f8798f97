"""Faults of the engine: a step that raises, a step that hangs (the watchdog), and recovery.

On the virtual network and clock: the echo engine's hung step sleeps its
``hang_seconds`` on the virtual clock (``_helpers/virtual_server.py``), so the
watchdog's timeout and the recovery happen at exact times.
"""

from __future__ import annotations

import json

import pytest
import trio

from _helpers.bad_client import BadClient
from pplex_trio.engine import EchoEngine

OPEN = json.dumps({"type": "open"})
POLL = 0.05  # how often the tests look


async def health(server) -> tuple[int, dict]:
    response = await server.get("/health")
    return response.status_code, response.json()


async def open_raw(server) -> BadClient:
    client = await server.bad_client("/v1/audio/duplex")
    await client.send(OPEN)
    return client


async def serves_a_witness(server) -> None:
    """A conversation of 0.8 s gets every frame back."""
    witness = server.witness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(witness.run)
        await witness.ready.wait()
        await trio.sleep(0.8)
        witness.stop.set()
    witness.check()


@pytest.mark.server_errors_expected
async def test_a_hung_engine_step_ends_its_conversations_reports_stalled_and_recovers(fault_server, autojump_clock):
    # Step 20 hangs for 3 s (a GPU call that does not come back); the watchdog gives it 1 s.
    engine = EchoEngine(2, prefill_steps=2, hang_at_step=20, hang_seconds=3.0)
    server = await fault_server(engine, engine_timeout=1.0, client_timeout=10)
    live = await open_raw(server)
    code, messages = await live.read_until_closed(timeout=10)
    ended = trio.current_time()  # the watchdog's second after the step began
    assert code == 1011
    errors = [json.loads(m)["error"] for m in messages if isinstance(m, str) and '"error"' in m]
    assert errors == ["the model engine stalled; please reconnect"]
    status, body = await health(server)
    assert status == 503 and body["status"] == "stalled"
    refused = await open_raw(server)  # while the step is still in flight
    code, messages = await refused.read_until_closed(timeout=5)
    assert code == 1013 and "stalled" in messages[-1]
    with trio.fail_after(10):  # the step returns (3 s after it began), the engine is reset
        while (await health(server))[0] != 200:
            await trio.sleep(POLL)
    assert trio.current_time() - ended == pytest.approx(3.0 - 1.0, abs=POLL)
    await serves_a_witness(server)  # and the server serves again, losing nothing
    for client in (live, refused):
        client.close()


@pytest.mark.server_errors_expected
async def test_an_engine_step_that_raises_ends_its_conversations_and_the_server_goes_on(fault_server, autojump_clock):
    engine = EchoEngine(2, prefill_steps=2, fail_at_step=10)
    server = await fault_server(engine)
    first = await open_raw(server)
    code, messages = await first.read_until_closed(timeout=10)
    assert code == 1011 and "internal error in the model engine" in messages[-1]
    await serves_a_witness(server)
    assert (await health(server))[1]["status"] == "ok"
    first.close()
