"""The loss tests' UDP relay itself (``_helpers/udp_relay.py``), with plain sockets standing for the two ends:
what it loses, how long it holds, and that it loses nothing when told to lose nothing."""

from __future__ import annotations

import contextlib
import math
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from _helpers.udp_relay import Direction, UdpRelay, is_rtp

OFFER = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
    "m=audio 50000 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 192.0.2.7\r\n"
    "a=candidate:a 1 udp 2130706431 192.0.2.7 50000 typ host\r\n"
    "a=candidate:b 1 udp 2130706431 fe80::1 50001 typ host\r\n"
    "a=end-of-candidates\r\n"
    "m=application 50000 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 192.0.2.7\r\n"
    "a=candidate:a 1 udp 2130706431 192.0.2.7 50000 typ host\r\n"
)


def endpoint() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2)
    return sock


def rtp(n: int) -> bytes:
    """An RTP packet numbered ``n`` (version 2, payload type 111), its send time after the header."""
    return struct.pack("!BBHII", 0x80, 111, n & 0xFFFF, n * 960, 1) + struct.pack("!d", time.monotonic())


@contextlib.contextmanager
def wired(relay: UdpRelay) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A caller and a server socket, the relay between them as the rewritten descriptions would put it."""
    with endpoint() as caller, endpoint() as server:
        relay.offer(OFFER.replace("192.0.2.7 50000", f"127.0.0.1 {caller.getsockname()[1]}"))
        relay.answer(OFFER.replace("192.0.2.7 50000", f"127.0.0.1 {server.getsockname()[1]}"))
        yield caller, server


def receive_all(sock: socket.socket, quiet: float = 0.3) -> list[tuple[float, bytes]]:
    """What comes to ``sock`` until it has been quiet ``quiet`` seconds: (when, datagram)."""
    got = []
    sock.settimeout(quiet)
    while True:
        try:
            data = sock.recv(2048)
        except TimeoutError:
            return got
        got.append((time.monotonic(), data))


def send(sender: socket.socket, side: socket.socket, receiver: socket.socket, datagrams: list[bytes]) -> list[bytes]:
    """``datagrams`` from ``sender`` to the relay's ``side``, in batches that the sockets' buffers hold; what
    came to ``receiver``."""
    got = []
    for batch in range(0, len(datagrams), 100):
        for data in datagrams[batch : batch + 100]:
            sender.sendto(data, side.getsockname())
        got += [data for _, data in receive_all(receiver, quiet=0.05)]
    return got


def test_each_side_sees_the_relay_as_its_one_candidate_and_the_relay_remembers_the_real_ones():
    with UdpRelay() as relay:
        offer = relay.offer(OFFER)
        answer = relay.answer(OFFER.replace("192.0.2.7", "192.0.2.9"))
        assert relay.caller == ("192.0.2.7", 50000) and relay.server == ("192.0.2.9", 50000)
        for text, side in ((offer, relay.server_side), (answer, relay.caller_side)):
            host, port = side.getsockname()
            candidates = [line for line in text.split("\r\n") if line.startswith("a=candidate:")]
            assert candidates == [f"a=candidate:1 1 udp 2130706431 {host} {port} typ host"] * 2  # (one a section)
            assert "192.0.2" not in text and "fe80" not in text
            assert text.count(f"m=audio {port} ") == 1 and "a=end-of-candidates" in text


def test_nothing_is_lost_or_reordered_at_no_loss_and_no_jitter_both_ways():
    with UdpRelay(seed=5) as relay:
        with wired(relay) as (caller, server):
            up = send(caller, relay.caller_side, server, [rtp(n) for n in range(300)])
            down = send(server, relay.server_side, caller, [b"\x17" + bytes([n % 256]) * 20 for n in range(300)])
    assert [struct.unpack("!H", d[2:4])[0] for d in up] == list(range(300))
    assert len(down) == 300 and down[7] == b"\x17" + bytes([7]) * 20
    assert (relay.up.forwarded, relay.up.dropped, relay.up.rtp_sent) == (300, 0, 300)
    assert (relay.down.forwarded, relay.down.dropped, relay.down.rtp_sent) == (300, 0, 0)


def test_the_loss_rate_is_binomial_for_its_seed_and_each_direction_its_own():
    sent, loss = 2000, 0.15
    with UdpRelay(up=Direction(loss=loss), seed=11) as relay:
        with wired(relay) as (caller, server):
            came = send(caller, relay.caller_side, server, [rtp(n + 100) for n in range(sent)])
            arrived = len(came)
            for n in range(200):
                server.sendto(rtp(n), relay.server_side.getsockname())
            back = len(receive_all(caller))
    sigma = math.sqrt(sent * loss * (1 - loss))
    assert abs(relay.up.dropped - sent * loss) < 4 * sigma  # (4 sigma: one seed in ~16,000 fails)
    assert relay.up.rtp_dropped == relay.up.dropped and arrived == relay.up.forwarded == sent - relay.up.dropped
    # Which were dropped, by their numbers (the test's own count: those that did not come)
    numbers = {struct.unpack("!H", d[2:4])[0] for d in came}
    assert relay.up.rtp_first == 100 and relay.up.rtp_dropped_numbers == sorted(set(range(100, 100 + sent)) - numbers)
    assert back == 200 and relay.down.dropped == 0


def test_jitter_holds_each_datagram_up_to_its_bound_and_reorders_them():
    jitter = 0.04
    with UdpRelay(up=Direction(jitter=jitter), seed=3) as relay:
        with wired(relay) as (caller, server):
            for n in range(100):
                caller.sendto(rtp(n), relay.caller_side.getsockname())
                time.sleep(0.005)
            got = receive_all(server)
    delays = relay.up.delays
    assert len(got) == 100 and all(0 <= d <= jitter for d in delays)
    assert min(delays) < 0.2 * jitter and max(delays) > 0.8 * jitter  # (spread over the whole range)
    order = [struct.unpack("!H", data[2:4])[0] for _, data in got]
    assert order != sorted(order) and sorted(order) == list(range(100))  # overtaken, none lost
    assert relay.up.rtp_overtaken == sum(n < max(order[:i], default=-1) for i, n in enumerate(order))
    for at, data in got:
        n = struct.unpack("!H", data[2:4])[0]
        sent_at = struct.unpack("!d", data[12:20])[0]
        assert at - sent_at >= delays[n] - 0.001  # never before its hold was over


@pytest.mark.parametrize(
    ("first_two", "expected"), [(b"\x80\x6f", True), (b"\x80\xc8", False), (b"\x00\x01", False), (b"\x17\xfe", False)]
)
def test_rtp_is_told_from_rtcp_stun_and_dtls(first_two, expected):
    assert is_rtp(first_two + bytes(10)) is expected
