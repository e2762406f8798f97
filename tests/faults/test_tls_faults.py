"""Clients that misbehave on a TLS server: in the handshake, and as WSS clients once live.

TLS adds a phase before HTTP (the handshake) and moves the socket one layer
down; the guarantees must not change: a bad client is gone within the client
timeout, and a witness beside it loses nothing.
"""

from __future__ import annotations

import ssl
from functools import partial

import httpx
import pytest
import trio

from _helpers.bad_client import CLIENT_TIMEOUT, BadClient
from _helpers.ws import RawWitness
from faults.test_transport_faults import BEHAVIOURS, GONE_WITHIN, PATHS, bring_to, misbehave, witness_talks_on_then_ends
from pplex_trio.client import client_ssl_context

pytestmark = pytest.mark.serial  # their witnesses need the CPU: they run after the parallel suite


def trusting() -> ssl.SSLContext:
    return client_ssl_context(insecure=True)  # the server's self-signed certificate


async def get(server, path: str) -> dict:
    async with httpx.AsyncClient(verify=False) as http:
        return (await http.get(server.handle.http_url + path, timeout=5)).json()


@pytest.fixture
async def tls_server(fault_server, tmp_path):
    return await fault_server(ssl_dir=tmp_path / "tls")


@pytest.mark.parametrize("opening", [b"", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"\x00\x01garbage"])
async def test_a_handshake_that_never_finishes_is_dropped(tls_server, opening):
    """Nothing, half a ClientHello, or bytes that are neither TLS nor HTTP."""
    stream = await trio.open_tcp_stream("127.0.0.1", tls_server.port)
    await stream.send_all(opening)
    assert (await get(tls_server, "/health"))["status"] == "ok"  # served meanwhile
    with trio.fail_after(CLIENT_TIMEOUT + 2):
        try:
            while await stream.receive_some(1024):
                pass  # the server closes it
        except trio.BrokenResourceError:
            pass  # or resets it
    await stream.aclose()


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("protocol", ["raw", "moshi"])
async def test_a_misbehaving_wss_client_costs_the_others_nothing(tls_server, nursery, protocol, behaviour):
    witness = RawWitness(tls_server.handle.ws_url, ssl_context=trusting())
    nursery.start_soon(witness.run)
    with trio.fail_after(10):
        await witness.ready.wait()
    bad = await BadClient.connect(tls_server.port, PATHS[protocol], tls=trusting(),
                                  rcvbuf=4096 if behaviour == "stop_reading" else None)
    await bring_to("live", protocol, bad, tls_server.port, 0)
    await misbehave(behaviour, bad)
    with trio.fail_after(GONE_WITHIN):
        while len((await get(tls_server, "/api/sessions"))["sessions"]) > 1:  # only the witness left
            await trio.sleep(0.05)
    await witness_talks_on_then_ends(witness, partial(get, tls_server, "/health"))
    bad.close()
