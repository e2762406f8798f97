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
from aiortc.rtp import HeaderExtensionsMap, RtcpPacket, RtpPacket, is_rtcp  # noqa: E402

from _helpers.aio import run_asyncio  # noqa: E402
from pplex_trio.server.webrtc._rtp import (  # noqa: E402
    CATCH_UP_SECONDS,
    PACKET_TICKS,
    REPORT_SECONDS,
    CallClock,
    RtpAudio,
)

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
        self.state, self.server_out = "connected", server_out
        self._rx_srtp: pylibsrtp.Session | None = pylibsrtp.Session(
            pylibsrtp.Policy(key=server_in, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND)
        )
        self._tx_srtp: pylibsrtp.Session | None = pylibsrtp.Session(
            pylibsrtp.Policy(key=server_out, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        )
        self._rtp_header_extensions_map = extensions()
        self.transport = type("IceTransport", (), {"_connection": Connection()})()


class Sender:
    """aiortc's sender for the audio: its transport, and whether it was started."""

    def __init__(self, transport: Dtls) -> None:
        self.transport = transport
        self.started = False

    async def send(self, parameters: Any) -> None:
        self.started = True


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
    audio = RtpAudio(Sender(dtls), ANSWER, lambda sequence, payload: heard.append((sequence, payload)))
    caller_out = pylibsrtp.Session(pylibsrtp.Policy(key=up, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND))
    caller_in = pylibsrtp.Session(pylibsrtp.Policy(key=down, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND))
    return audio, dtls, heard, caller_out, caller_in


def rtp(payload_type: int, sequence: int, payload: bytes) -> bytes:
    return RtpPacket(payload_type, 0, sequence & 0xFFFF, sequence * 960 & 0xFFFFFFFF, 777, payload).serialize()


def test_the_callers_audio_and_rtcp_are_taken_and_the_rest_goes_on_to_aiortc(call):
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
    assert connection.passed_on == [dtls_record]  # DTLS (and the data channel in it): aiortc's; RTCP: ours
    received(caller_out.protect(rtp(0, 5, b"\x55" * 40)), 1)  # not the Opus the answer took: dropped
    damaged = bytearray(caller_out.protect(rtp(OPUS, 6, b"\x66" * 40)))
    damaged[20] ^= 0xFF
    received(bytes(damaged), 1)  # fails SRTP's authentication: dropped, as aiortc drops it
    received(opus[0], 1)  # a replay: dropped
    received(caller_out.protect_rtcp(bytes([0x80, 201, 0, 1]) + os.urandom(4)), 1)  # (unreadable: dropped)
    received(rtcp, 1)  # a replay: dropped
    assert len(heard) == 4 and connection.passed_on == [dtls_record]


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
    audio.send(b"\x01" * 30, 0.0)
    connection._nominated[1] = Pair(type("Protocol", (), {"transport": socket})())
    dtls.state = "connecting"
    assert not audio.ready
    audio.send(b"\x02" * 30, 0.0)
    dtls.state = "connected"
    assert audio.ready and socket.sent == []
    for k in range(3):
        audio.send(bytes([k + 10]) * 30, 0.02 * k)
    voice = [(data, addr) for data, addr in socket.sent if not is_rtcp(data)]  # (our first report went too)
    assert [addr for _, addr in voice] == [("192.0.2.7", 5004)] * 3
    packets = [RtpPacket.parse(caller_in.unprotect(data), extensions()) for data, _ in voice]
    assert [p.payload for p in packets] == [bytes([k + 10]) * 30 for k in range(3)]
    assert {(p.payload_type, p.ssrc, p.extensions.mid) for p in packets} == {(OPUS, SSRC, MID)}
    assert [p.marker for p in packets] == [1, 0, 0]  # (a talk spurt's start)
    assert [(p.sequence_number - packets[0].sequence_number) & 0xFFFF for p in packets] == [0, 1, 2]
    assert [(p.timestamp - packets[0].timestamp) & 0xFFFFFFFF for p in packets] == [0, 960, 1920]
    assert PACKET_TICKS == 960  # 20 ms of Opus's 48 kHz RTP clock
    socket.sent.clear()
    connection._nominated[1].protocol.transport = None  # the socket closed under it
    audio.send(b"\x03" * 30, 1.0)
    assert socket.sent == []


def test_our_reports_tell_the_caller_what_came_of_its_audio_and_what_the_voice_sent(call):
    """About every second (RFC 3550's interval, drawn from ``REPORT_SECONDS``): a sender report on the voice, a
    reception report on the caller's audio (what a browser's FEC is set by), the CNAME."""
    audio, dtls, _, caller_out, caller_in = call
    received = dtls.transport._connection.data_received
    socket = Socket()
    dtls.transport._connection._nominated[1] = Pair(type("Protocol", (), {"transport": socket})())
    came = [k for k in range(40) if k not in (7, 8, 20, 31)]  # four of the caller's forty packets lost
    for k in came:
        received(caller_out.protect(rtp(OPUS, 65_520 + k, b"\x01" * 40)), 1)  # (its numbers wrap past 65535)
    caller_ntp = 0x0123_4567_89AB_CDEF
    sender_report = bytes([0x80, 200, 0, 6]) + (777).to_bytes(4, "big") + caller_ntp.to_bytes(8, "big")
    received(caller_out.protect_rtcp(sender_report + bytes(12)), 1)  # (its RTP time, packet and octet counts)
    reports = []
    for tick in range(200):  # four seconds of the voice
        before = len(socket.sent)
        audio.send(b"\x02" * 50, 100.0 + 0.02 * tick)
        reports += [(tick, data) for data, _ in socket.sent[before:] if is_rtcp(data)]
    gaps = [0.02 * (b - a) for (a, _), (b, _) in zip(reports, reports[1:])]
    assert reports[0][0] == 0 and all(REPORT_SECONDS[0] <= gap <= REPORT_SECONDS[1] + 0.02 for gap in gaps)
    tick, first = reports[0]
    sr, sdes = RtcpPacket.parse(caller_in.unprotect_rtcp(first))
    assert (sr.ssrc, sr.sender_info.packet_count, sr.sender_info.octet_count) == (SSRC, 1, 50)
    (block,) = sr.reports
    assert (block.ssrc, block.packets_lost, block.fraction_lost) == (777, 4, 4 * 256 // 40)
    assert block.highest_sequence == (1 << 16) + (65_520 + 39 - 65_536)  # (extended: one cycle)
    assert block.lsr == (caller_ntp >> 16) & 0xFFFFFFFF and 0 <= block.dlsr < 65536  # (answered within 1 s)
    assert [(chunk.ssrc, chunk.items) for chunk in sdes.chunks] == [(SSRC, [(1, b"server")])]
    sr, _ = RtcpPacket.parse(caller_in.unprotect_rtcp(reports[1][1]))
    assert sr.sender_info.packet_count == reports[1][0] + 1 and sr.reports[0].fraction_lost == 0  # (none since)
    voice = [RtpPacket.parse(caller_in.unprotect(data)) for data, _ in socket.sent if not is_rtcp(data)]
    assert sr.sender_info.rtp_timestamp == voice[reports[1][0]].timestamp  # (as the packet it went with)


def test_aiortcs_own_sender_never_starts_and_the_voice_ends_with_our_bye():
    dtls, socket = Dtls(os.urandom(30), os.urandom(30)), Socket()
    sender = Sender(dtls)
    audio = RtpAudio(sender, ANSWER, lambda sequence, payload: None)
    run_asyncio(sender.send(object()))  # (as aiortc does once DTLS is up)
    assert not sender.started
    audio.close()  # before the connection is up: nothing to say goodbye on
    dtls.transport._connection._nominated[1] = Pair(type("Protocol", (), {"transport": socket})())
    audio.send(b"\x01" * 30, 0.0)
    audio.close()
    assert len(socket.sent) == 3  # the packet, our first report, the last one
    caller_in = pylibsrtp.Session(pylibsrtp.Policy(key=dtls.server_out, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND))
    caller_in.unprotect(socket.sent[0][0])
    caller_in.unprotect_rtcp(socket.sent[1][0])
    last = RtcpPacket.parse(caller_in.unprotect_rtcp(socket.sent[2][0]))
    assert [type(p).__name__ for p in last] == ["RtcpSrPacket", "RtcpSdesPacket", "RtcpByePacket"]
    assert last[2].sources == [SSRC]


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
