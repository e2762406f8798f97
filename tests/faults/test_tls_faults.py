"""Clients that misbehave on a TLS server: in the handshake, and as WSS clients once live.

TLS adds a phase before HTTP (the handshake) and moves the socket one layer
down; the guarantees must not change: a bad client is gone within the client
timeout, and a witness beside it loses nothing.

On the virtual network and clock (the server's TLS over in-memory connections);
one handshake and one WSS client that stops reading run on real sockets too
(``serial``), since how TLS records sit in the kernel's buffers is the real
network's.
"""

from __future__ import annotations

import contextlib
import ssl

import pytest
import trio
from faults.test_transport_faults import (
    BEHAVIOURS,
    GONE_WITHIN,
    PATHS,
    POLL,
    REAL_GONE_WITHIN,
    bring_to,
    misbehave,
    start_witness,
    witness_talks_on_then_ends,
)

from _helpers.bad_client import CLIENT_TIMEOUT
from pplex_trio.client import client_ssl_context
from pplex_trio.server.transport._transport import WATCH_INTERVAL

OPENINGS = {
    "nothing": b"",
    "half a ClientHello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    "neither TLS nor HTTP": b"\x00\x01garbage",
}


def trusting() -> ssl.SSLContext:
    return client_ssl_context(insecure=True)  # the server's self-signed certificate


async def a_handshake_that_never_finishes_is_dropped(server, opening: bytes, within: float) -> tuple[float, bytes]:
    """How long the server kept the connection, and what it answered."""
    stream = await server.connect()
    await stream.send_all(opening)
    opened = trio.current_time()
    async with server.http(ssl_context=trusting()) as http:
        assert (await http.get("/health")).json()["status"] == "ok"  # served meanwhile
    answer = b""
    with trio.fail_after(within):
        with contextlib.suppress(trio.BrokenResourceError):  # closed, or reset
            while chunk := await stream.receive_some(1024):
                answer += chunk
    await stream.aclose()
    return trio.current_time() - opened, answer


@pytest.mark.parametrize("opening", list(OPENINGS))
async def test_a_handshake_that_never_finishes_is_dropped(fault_server, autojump_clock, tmp_path, opening):
    """Nothing, or half a ClientHello: dropped at the client timeout (the handshake's deadline, and the
    transport's read deadline).  Bytes that are neither TLS nor HTTP: answered 400 at once."""
    server = await fault_server(ssl_dir=tmp_path / "tls")
    lasted, answer = await a_handshake_that_never_finishes_is_dropped(server, OPENINGS[opening], CLIENT_TIMEOUT + 2)
    if opening == "neither TLS nor HTTP":
        assert lasted == 0 and answer.startswith(b"HTTP/1.1 400 Bad Request")
    else:
        assert CLIENT_TIMEOUT <= lasted <= CLIENT_TIMEOUT + WATCH_INTERVAL and answer == b""


@pytest.mark.serial
async def test_on_real_sockets_a_handshake_that_never_finishes_is_dropped(real_fault_server, tmp_path):
    server = await real_fault_server(ssl_dir=tmp_path / "tls")
    await a_handshake_that_never_finishes_is_dropped(server, OPENINGS["half a ClientHello"], CLIENT_TIMEOUT + 2)


async def a_misbehaving_wss_client_costs_the_others_nothing(
    server, nursery, protocol: str, behaviour: str, gone_within: float
) -> None:
    witness = await start_witness(nursery, server, ssl_context=trusting())
    bad = await server.bad_client(
        PATHS[protocol], tls=trusting(), receive_buffer=4096 if behaviour == "stop_reading" else None
    )
    await bring_to("live", protocol, bad, server, 0)
    await misbehave(behaviour, bad)
    async with server.http(ssl_context=trusting()) as http:
        with trio.fail_after(gone_within + 2 * POLL):
            while len((await http.get("/api/sessions")).json()["sessions"]) > 1:  # only the witness left
                await trio.sleep(POLL)
    await witness_talks_on_then_ends(witness, _Trusting(server))
    bad.close()


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("protocol", ["raw", "moshi"])
async def test_a_misbehaving_wss_client_costs_the_others_nothing(
    fault_server, autojump_clock, tmp_path, nursery, protocol, behaviour
):
    server = await fault_server(ssl_dir=tmp_path / "tls")
    await a_misbehaving_wss_client_costs_the_others_nothing(
        server, nursery, protocol, behaviour, GONE_WITHIN[behaviour]
    )


@pytest.mark.serial
async def test_on_real_sockets_a_wss_client_that_stops_reading_costs_the_others_nothing(
    real_fault_server, tmp_path, nursery
):
    server = await real_fault_server(ssl_dir=tmp_path / "tls")
    await a_misbehaving_wss_client_costs_the_others_nothing(server, nursery, "raw", "stop_reading", REAL_GONE_WITHIN)


class _Trusting:
    """A TLS server's JSON, fetched trusting its self-signed certificate (what ``witness_talks_on_then_ends`` reads)."""

    def __init__(self, server):
        self.server = server

    async def get_json(self, path: str):
        async with self.server.http(ssl_context=trusting()) as http:
            return (await http.get(path)).json()
