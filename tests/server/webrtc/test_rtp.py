"""A call's audio packets without a network (``_rtp.py``): ``RtpAudio`` between fake ICE and DTLS transports with
real SRTP keys (pylibsrtp, as aiortc's DTLS agrees them), and ``CallClock`` on a fake loop's clock.

The caller's side of each packet is made and read here with pylibsrtp and aiortc's RTP parser, independently of
the code under test."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import pylibsrtp
import pytest

pytest.importorskip("aiortc")

from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters  # noqa: E402
from aiortc.rtp import HeaderExtensionsMap, RtpPacket  # noqa: E402

from pplex_trio.server.webrtc._rtp import CATCH_UP_SECONDS, PACKET_TICKS, CallClock, RtpAudio  # noqa: E402

OPUS, SSRC, MID = 111, 3_141_592, "0"
ANSWER = f"""v=0
o=- 1 1 IN IP4 0.0.0.0
s=-
t=0 0
a=group:BUNDLE {MID}
m=audio 9 UDP/TLS/RTP/SAVPF {OPUS}
c=IN IP4 0.0.0.0
a=sendrecv
a=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid
a=mid:{MID}
a=rtcp-mux
a=ssrc:{SSRC} cname:server
a=rtpmap:{OPUS} opus/48000/2
a=ice-ufrag:abcd
a=ice-pwd:abcdefghijklmnopqrstuvwx
a=fingerprint:sha-256 {":".join(["00"] * 32)}
a=setup:active
""".replace("\n", "\r\n")


@dataclass
class Socket:
    sent: list[tuple[bytes, Any]] = field(default_factory=list)

    def sendto(self, data: bytes, addr: Any) -> None:
        self.sent.append((data, addr))


@dataclass
class Pair:
    protocol: Any
    remote_addr: tuple[str, int] = ("192.0.2.7", 5004)


class Connection:
    """aioice's connection, as far as ``RtpAudio`` uses it: what it passes on is kept."""

    def __init__(self) -> None:
        self.passed_on: list[bytes] = []
        self._nominated: dict[int, Pair] = {}

    def data_received(self, data: bytes, component: int) -> None:
        self.passed_on.append(data)


class Dtls:
    """aiortc's DTLS transport once its handshake is done: SRTP keys both ways, the header extensions' map."""

    def __init__(self, server_in: bytes, server_out: bytes) -> None:
        self.state = "connected"
        self._rx_srtp: pylibsrtp.Session | None = pylibsrtp.Session(
            pylibsrtp.Policy(key=server_in, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND)
        )
        self._tx_srtp: pylibsrtp.Session | None = pylibsrtp.Session(
            pylibsrtp.Policy(key=server_out, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        )
        self._rtp_header_extensions_map = extensions()
        self.transport = type("IceTransport", (), {"_connection": Connection()})()


def extensions() -> HeaderExtensionsMap:
    mapping = HeaderExtensionsMap()
    uri = "urn:ietf:params:rtp-hdrext:sdes:mid"
    mapping.configure(RTCRtpParameters(headerExtensions=[RTCRtpHeaderExtensionParameters(id=1, uri=uri)]))
    return mapping


@pytest.fixture
def call() -> tuple[RtpAudio, Dtls, list[tuple[int, bytes]], pylibsrtp.Session, pylibsrtp.Session]:
    """An ``RtpAudio`` over fake transports, what it heard, and the caller's own SRTP sessions (out, in)."""
    up, down = os.urandom(30), os.urandom(30)
    dtls = Dtls(up, down)
    heard: list[tuple[int, bytes]] = []
    audio = RtpAudio(dtls, ANSWER, lambda sequence, payload: heard.append((sequence, payload)))
    caller_out = pylibsrtp.Session(pylibsrtp.Policy(key=up, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
    caller_in = pylibsrtp.Session(pylibsrtp.Policy(key=down, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND))
    return audio, dtls, heard, caller_out, caller_in


def rtp(payload_type: int, sequence: int, payload: bytes) -> bytes:
    return RtpPacket(payload_type, 0, sequence & 0xFFFF, sequence * 960 & 0xFFFFFFFF, 777, payload).serialize()


def test_the_callers_audio_packets_are_taken_and_the_rest_goes_on_to_aiortc(call):
    audio, dtls, heard, caller_out, _ = call
    connection = dtls.transport._connection
    received = connection.data_received  # (RtpAudio's, in aioice's place)
    opus = [caller_out.protect(rtp(OPUS, 65_534 + k, bytes([k + 1]) * 40)) for k in range(4)]
    for packet in opus:
        received(packet, 1)
    assert heard == [((65_534 + k) & 0xFFFF, bytes([k + 1]) * 40) for k in range(4)]  # (wrapping past 65535)
    rtcp = caller_out.protect_rtcp(bytes([0x80, 201, 0, 1]) + (777).to_bytes(4, "big"))
    dtls_record = bytes([22, 0xFE, 0xFD]) + os.urandom(20)
    received(rtcp, 1)
    received(dtls_record, 1)
    assert connection.passed_on == [rtcp, dtls_record]  # RTCP, DTLS (and the data channel in it): aiortc's
    received(caller_out.protect(rtp(0, 5, b"\x55" * 40)), 1)  # not the Opus the answer took: dropped
    damaged = bytearray(caller_out.protect(rtp(OPUS, 6, b"\x66" * 40)))
    damaged[20] ^= 0xFF
    received(bytes(damaged), 1)  # fails SRTP's authentication: dropped, as aiortc drops it
    received(opus[0], 1)  # a replay: dropped
    assert len(heard) == 4 and connection.passed_on == [rtcp, dtls_record]


@pytest.mark.parametrize("dtls_up", [True, False])
def test_an_empty_datagram_from_anyone_is_dropped(call, dtls_up):
    """aioice hands on a datagram from any address; aiortc's DTLS task would fail on an empty one (and the call
    with it)."""
    audio, dtls, heard, _, _ = call
    if not dtls_up:
        dtls._rx_srtp = None
    dtls.transport._connection.data_received(b"", 1)
    assert heard == [] and dtls.transport._connection.passed_on == []


def test_before_dtls_is_up_everything_goes_on_to_aiortc(call):
    audio, dtls, heard, caller_out, _ = call
    dtls._rx_srtp = None
    packet = caller_out.protect(rtp(OPUS, 1, b"\x01" * 40))
    dtls.transport._connection.data_received(packet, 1)
    assert heard == [] and dtls.transport._connection.passed_on == [packet]


def test_the_voice_goes_out_as_the_answer_said_once_the_connection_is_up(call):
    audio, dtls, _, _, caller_in = call
    connection, socket = dtls.transport._connection, Socket()
    assert not audio.ready  # no pair chosen by ICE yet
    audio.send(b"\x01" * 30)
    connection._nominated[1] = Pair(type("Protocol", (), {"transport": socket})())
    dtls.state = "connecting"
    assert not audio.ready
    audio.send(b"\x02" * 30)
    dtls.state = "connected"
    assert audio.ready and socket.sent == []
    for k in range(3):
        audio.send(bytes([k + 10]) * 30)
    assert [addr for _, addr in socket.sent] == [("192.0.2.7", 5004)] * 3
    packets = [RtpPacket.parse(caller_in.unprotect(data), extensions()) for data, _ in socket.sent]
    assert [p.payload for p in packets] == [bytes([k + 10]) * 30 for k in range(3)]
    assert {(p.payload_type, p.ssrc, p.extensions.mid) for p in packets} == {(OPUS, SSRC, MID)}
    assert [p.marker for p in packets] == [1, 0, 0]  # (a talk spurt's start)
    assert [(p.sequence_number - packets[0].sequence_number) & 0xFFFF for p in packets] == [0, 1, 2]
    assert [(p.timestamp - packets[0].timestamp) & 0xFFFFFFFF for p in packets] == [0, 960, 1920]
    assert PACKET_TICKS == 960  # 20 ms of Opus's 48 kHz RTP clock
    socket.sent.clear()
    connection._nominated[1].protocol.transport = None  # the socket closed under it
    audio.send(b"\x03" * 30)
    assert socket.sent == []


class FakeLoop:
    """An asyncio loop's clock and timers, driven by the test."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, fn: Any) -> Timer:
        timer = Timer(when, fn)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float, *, late: float = 0.0) -> None:
        """Run the timers due over ``seconds``, each ``late`` after its time (a busy loop)."""
        end = self.now + seconds
        while due := [t for t in self.timers if not t.cancelled and t.when <= end]:
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = max(self.now, timer.when + late)
            timer.fn()
        self.now = max(self.now, end)


@dataclass
class Timer:
    when: float
    fn: Any
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


def test_every_call_ticks_every_20_ms_from_the_next_tick_until_removed():
    loop = FakeLoop()
    clock = CallClock(loop)  # type: ignore[arg-type]
    ticks: dict[str, list[float]] = {"a": [], "b": []}
    clock.add("a", ticks["a"].append)
    loop.advance(0.045)
    clock.add("b", ticks["b"].append)
    loop.advance(0.1)
    assert ticks["a"] == pytest.approx([100.02 + 0.02 * k for k in range(7)])
    assert ticks["b"] == pytest.approx([100.06 + 0.02 * k for k in range(5)])  # from the next tick on
    clock.remove("a")
    loop.advance(0.04)
    assert len(ticks["a"]) == 7 and len(ticks["b"]) == 7
    clock.remove("b")
    clock.remove("b")  # (twice: harmless)
    assert all(t.cancelled for t in loop.timers)  # the clock stops with its last call
    loop.advance(1.0)
    assert len(ticks["b"]) == 7


def test_a_late_loop_catches_up_at_once_and_a_stalled_one_starts_anew():
    loop = FakeLoop()
    clock = CallClock(loop)  # type: ignore[arg-type]
    ticks: list[float] = []
    clock.add("a", ticks.append)
    loop.advance(0.02)
    loop.now += 0.1  # the loop was busy 100 ms: the five ticks it owes run at once
    loop.advance(0.0)
    assert len(ticks) == 6 and ticks[1:] == [ticks[1]] * 5
    loop.now += CATCH_UP_SECONDS + 0.3  # a stall: what it owes beyond the catch-up is not sent in a burst
    loop.advance(0.0)
    burst = len(ticks) - 6
    assert burst <= CATCH_UP_SECONDS / 0.02 + 2
    loop.advance(0.1)
    assert len(ticks) - 6 - burst == 5  # then 20 ms apart again


def test_one_calls_failing_tick_is_logged_and_the_others_go_on(caplog):
    loop = FakeLoop()
    clock = CallClock(loop)  # type: ignore[arg-type]
    ticks: list[float] = []

    def broken(now: float) -> None:
        raise RuntimeError("broken call")

    clock.add("broken", broken)
    clock.add("fine", ticks.append)
    with caplog.at_level(logging.ERROR, logger="pplex_trio.server.webrtc._rtp"):
        loop.advance(0.06)
    assert len(ticks) == 3
    assert sum("audio tick failed" in r.getMessage() for r in caplog.records) == 3
