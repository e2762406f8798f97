"""A call's audio packets, straight between its UDP socket and the codecs; aiortc keeps the rest of the call.

aiortc's media path costs most of a call's CPU, in asyncio's machinery rather than in the work: each packet goes
through aioice's queue, the DTLS transport's task and the RTP receiver's coroutines on the way in, and through the
sender's task, a track's ``recv`` and two awaits on the way out; each call paces its voice with a timer of its own.
Here the caller's SRTP packets are taken where aioice hands its datagrams on (before its queue), decrypted with the
keys aiortc's DTLS agreed and handed to the call; the model's voice packets are protected with those keys and
written to the socket of the pair ICE chose; every call's audio moves at the ticks of one 20 ms clock on the loop
(:class:`CallClock`). The call's RTCP is ours too, since only we know what went each way: about every second a
sender report on the voice, with a reception report on the caller's audio (its losses, by which a browser turns its
Opus FEC on), a BYE at the end, and the caller's own reports taken in. aiortc keeps ICE and its consent checks, DTLS
and the data channel; its own sender for the audio never starts (its ``send``, which aiortc calls as DTLS comes up,
is replaced: it would send reports and a BYE of its own, counting nothing). Private names of aiortc and aioice are
touched here (the version is pinned; the WebRTC tests run through every one): the ICE connection's ``data_received``
and ``_nominated``, the DTLS transport's SRTP sessions (``_rx_srtp``, ``_tx_srtp``) and its header extensions' map.
"""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from collections.abc import Callable
from typing import Any

import pylibsrtp
from aiortc.clock import current_ntp_time
from aiortc.rtcrtpreceiver import StreamStatistics
from aiortc.rtp import (
    RtcpByePacket,
    RtcpPacket,
    RtcpReceiverInfo,
    RtcpSdesPacket,
    RtcpSenderInfo,
    RtcpSourceInfo,
    RtcpSrPacket,
    RtpPacket,
    is_rtcp,
)
from aiortc.sdp import SessionDescription

from ._media import PACKET_SECONDS

logger = logging.getLogger(__name__)

RTP_CLOCK = 48_000  # Opus's RTP clock rate, whatever its audio's (RFC 7587)
PACKET_TICKS = round(RTP_CLOCK * PACKET_SECONDS)
CATCH_UP_SECONDS = 0.5  # a loop this late sends what it owes at once; later still, the pace starts anew
REPORT_SECONDS = (0.5, 1.5)  # between two of our RTCP reports, drawn anew each time (as aiortc, RFC 3550 6.2)


class RtpAudio:
    """One peer connection's audio packets (see the module's doc): the caller's Opus payloads go to ``heard``
    (with their sequence numbers, in the order they came), :meth:`send` sends the model's, and the reports both
    ways, until :meth:`close`. Made once the answer is set, from aiortc's sender for the audio (kept from
    starting) and the answer: what the caller may send and the browser expects (payload type, SSRC, MID, CNAME)."""

    def __init__(self, sender: Any, answer: str, heard: Callable[[int, bytes], None]) -> None:
        media = next(m for m in SessionDescription.parse(answer).media if m.kind == "audio")
        payload_type = media.rtp.codecs[0].payloadType
        assert payload_type is not None  # (an answer's codecs are numbered)
        self._payload_type = payload_type
        self._ssrc, self._cname = media.ssrc[0].ssrc, (media.ssrc[0].cname or "").encode()
        self._mid = media.rtp.muxId
        sender.send = _kept_from_starting  # (aiortc calls it as DTLS comes up)
        self._dtls, self._heard = sender.transport, heard
        self._connection = self._dtls.transport._connection  # (aioice's: the datagrams of the pair ICE chose)
        self._pass_on = self._connection.data_received
        self._connection.data_received = self._received
        self._sequence, self._timestamp = random.getrandbits(16), random.getrandbits(32)
        self._first = True
        self._packets = self._octets = 0  # the voice's, sent
        self._caller: int | None = None  # the caller's audio's SSRC (its latest packet's)
        self._heard_stats = StreamStatistics(RTP_CLOCK)
        self._caller_report: tuple[int, int] | None = None  # the caller's last sender report's time, ours then (NTP)
        self._report_at = 0.0  # when our next report goes (0: with the first packet)

    def _received(self, data: bytes, component: int) -> None:
        """A datagram of the connection: the caller's audio and RTCP are ours, the rest (DTLS, the data channel's
        SCTP) goes on to aiortc; an empty one (anyone may send one to the port) is dropped: aiortc would fail on
        it and end the call."""
        if not data:
            return
        srtp = self._dtls._rx_srtp  # (set once DTLS is up)
        if srtp is None or not 127 < data[0] < 192:
            self._pass_on(data, component)
        elif is_rtcp(data):
            self._reported(srtp, data)
        else:
            try:
                packet = RtpPacket.parse(srtp.unprotect(data))
            except (pylibsrtp.Error, ValueError):  # (not ours, replayed, or damaged: as aiortc, dropped)
                return
            if packet.payload_type == self._payload_type and packet.payload:
                if packet.ssrc != self._caller:  # (the first, or a new source: reported on from here)
                    self._caller, self._heard_stats = packet.ssrc, StreamStatistics(RTP_CLOCK)
                self._heard_stats.add(packet)
                self._heard(packet.sequence_number, packet.payload)

    def _reported(self, srtp: pylibsrtp.Session, data: bytes) -> None:
        """The caller's RTCP: its sender report's time is noted (ours answer it: the browser's round trip)."""
        try:
            packets = RtcpPacket.parse(srtp.unprotect_rtcp(data))
        except (pylibsrtp.Error, ValueError):
            return
        for packet in packets:
            if isinstance(packet, RtcpSrPacket) and packet.ssrc == self._caller:
                self._caller_report = (_middle(packet.sender_info.ntp_timestamp), _middle(current_ntp_time()))

    @property
    def ready(self) -> bool:
        """Whether packets can go: DTLS is up (its keys agreed) and ICE has chosen its pair."""
        return self._dtls.state == "connected" and self._dtls._tx_srtp is not None and 1 in self._connection._nominated

    def _socket(self) -> tuple[Any, Any] | None:
        """The chosen pair's socket and address (None: not ready, or the socket gone meanwhile)."""
        pair = self._connection._nominated.get(1)
        transport = None if pair is None else pair.protocol.transport
        return None if transport is None or not self.ready else (transport, pair.remote_addr)

    def send(self, payload: bytes, now: float) -> None:
        """Send one 20 ms Opus packet of the model's voice at ``now`` (the loop's time), and our report when its
        time has come (once :attr:`ready`, else nothing)."""
        if (socket := self._socket()) is None:
            return
        transport, address = socket
        packet = RtpPacket(self._payload_type, int(self._first), self._sequence, self._timestamp, self._ssrc, payload)
        packet.extensions.mid = self._mid
        data = self._dtls._tx_srtp.protect(packet.serialize(self._dtls._rtp_header_extensions_map))
        transport.sendto(data, address)
        self._first = False
        self._packets, self._octets = self._packets + 1, self._octets + len(payload)
        if now >= self._report_at:
            transport.sendto(self._dtls._tx_srtp.protect_rtcp(self._report()), address)
            self._report_at = now + random.uniform(*REPORT_SECONDS)
        self._sequence = (self._sequence + 1) & 0xFFFF
        self._timestamp = (self._timestamp + PACKET_TICKS) & 0xFFFFFFFF

    def close(self) -> None:
        """The voice ends: our last report, with a BYE (RFC 3550 6.6), if the call got so far."""
        if (socket := self._socket()) is not None:
            transport, address = socket
            bye = bytes(RtcpByePacket(sources=[self._ssrc]))
            transport.sendto(self._dtls._tx_srtp.protect_rtcp(self._report() + bye), address)

    def _report(self) -> bytes:
        """Our RTCP now: the voice's sender report (its RTP time the packet just sent's, or at the end the next
        one's: within 20 ms), with a reception report on the caller's audio once some came (RFC 3550 6.4), and the
        CNAME (6.5)."""
        now = current_ntp_time()
        reports = []
        if self._caller is not None:
            stats = self._heard_stats
            last, dlsr = 0, 0  # (no sender report of the caller's yet)
            if self._caller_report is not None:  # (its time, and how long ago, in 1/65536 s)
                last, dlsr = self._caller_report[0], (_middle(now) - self._caller_report[1]) & 0xFFFFFFFF
            highest = stats.cycles + (stats.max_seq or 0)
            lost = (stats.fraction_lost, stats.packets_lost)
            reports.append(RtcpReceiverInfo(self._caller, *lost, highest, stats.jitter, last, dlsr))
        sent = RtcpSenderInfo(now, self._timestamp, self._packets & 0xFFFFFFFF, self._octets & 0xFFFFFFFF)
        report = RtcpSrPacket(ssrc=self._ssrc, sender_info=sent, reports=reports)
        return bytes(report) + bytes(RtcpSdesPacket(chunks=[RtcpSourceInfo(self._ssrc, [(1, self._cname)])]))


async def _kept_from_starting(parameters: Any) -> None:
    """In aiortc's sender's place: it never starts (the voice and its reports go by :class:`RtpAudio`)."""


def _middle(ntp: int) -> int:
    """The middle 32 bits of a 64-bit NTP time (RTCP's short form: seconds and fraction, 16 bits each)."""
    return (ntp >> 16) & 0xFFFFFFFF


class CallClock:
    """The loop's one clock for every call's audio: every 20 ms each call's tick runs (its voice's next packet
    goes, its caller's audio whose time has come is handed out: every call's at one wakeup of the server's
    thread). A loop that fell behind catches up at once (up to ``CATCH_UP_SECONDS``; beyond, the pace starts
    anew)."""

    _clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CallClock] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: dict[object, Callable[[float], None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._next = 0.0

    @classmethod
    def of_running_loop(cls) -> CallClock:
        """The running loop's clock (made at its first call)."""
        loop = asyncio.get_running_loop()
        clock = cls._clocks.get(loop)
        if clock is None:
            clock = cls._clocks[loop] = cls(loop)
        return clock

    def add(self, key: object, tick: Callable[[float], None]) -> None:
        """Run ``tick(now)`` every 20 ms from the next tick, until :meth:`remove` of ``key``."""
        self._calls[key] = tick
        if self._timer is None:
            self._next = self._loop.time() + PACKET_SECONDS
            self._timer = self._loop.call_at(self._next, self._tick)

    def remove(self, key: object) -> None:
        """Stop ticking ``key`` (twice is harmless); the clock stops with its last call."""
        self._calls.pop(key, None)
        if not self._calls and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        now = self._loop.time()
        for tick in list(self._calls.values()):
            try:
                tick(now)
            except Exception:  # (one call's fault must not stop every other call's audio)
                logger.exception("a WebRTC call's audio tick failed")
        self._next += PACKET_SECONDS
        if self._next < now - CATCH_UP_SECONDS:
            self._next = now
        self._timer = self._loop.call_at(self._next, self._tick)
