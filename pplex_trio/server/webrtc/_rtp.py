"""A call's audio packets, straight between its UDP socket and the codecs; aiortc keeps the rest of the call.

aiortc's media path costs most of a call's CPU, in asyncio's machinery rather than in the work: each packet goes
through aioice's queue, the DTLS transport's task and the RTP receiver's coroutines on the way in, and through
the sender's task, a track's ``recv`` and two awaits on the way out; each call paces its voice with a timer of its
own. Here the caller's SRTP packets are taken where aioice hands its datagrams on (before its queue), decrypted
with the keys aiortc's DTLS agreed and handed to the call; the model's voice packets are protected with those
keys and written to the socket of the pair ICE chose; every call's audio moves at the ticks of one 20 ms clock
on the loop (:class:`CallClock`). aiortc keeps ICE and its consent checks, DTLS, RTCP and the data channel, and
its own sender sits parked (:class:`Parked`: it never sends a packet). Private names of aiortc and aioice are
touched here (the version is pinned; the WebRTC tests run through every one): the ICE connection's
``data_received`` and ``_nominated``, the DTLS transport's SRTP sessions (``_rx_srtp``, ``_tx_srtp``) and its
header extensions' map.
"""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from collections.abc import Callable
from typing import Any

import av
import pylibsrtp
from aiortc import MediaStreamTrack
from aiortc.rtp import RtpPacket, is_rtcp
from aiortc.sdp import SessionDescription

from ._media import PACKET_SECONDS

logger = logging.getLogger(__name__)

RTP_CLOCK = 48_000  # Opus's RTP clock rate, whatever its audio's (RFC 7587)
PACKET_TICKS = round(RTP_CLOCK * PACKET_SECONDS)
CATCH_UP_SECONDS = 0.5  # a loop this late sends what it owes at once; later still, the pace starts anew


class RtpAudio:
    """One peer connection's audio packets (see the module's doc): the caller's Opus payloads go to ``heard``
    (with their sequence numbers, in the order they came), :meth:`send` sends the model's. Made once the answer
    is set: what the answer says the caller may send and the browser expects (payload type, SSRC, MID)."""

    def __init__(self, dtls: Any, answer: str, heard: Callable[[int, bytes], None]) -> None:
        media = next(m for m in SessionDescription.parse(answer).media if m.kind == "audio")
        payload_type = media.rtp.codecs[0].payloadType
        assert payload_type is not None  # (an answer's codecs are numbered)
        self._payload_type = payload_type
        self._ssrc = media.ssrc[0].ssrc
        self._mid = media.rtp.muxId
        self._dtls, self._heard = dtls, heard
        self._connection = dtls.transport._connection  # (aioice's: the datagrams of the pair ICE chose)
        self._pass_on = self._connection.data_received
        self._connection.data_received = self._received
        self._sequence, self._timestamp = random.getrandbits(16), random.getrandbits(32)
        self._first = True

    def _received(self, data: bytes, component: int) -> None:
        """A datagram of the connection: the caller's audio is ours, the rest (DTLS, RTCP, the data channel's
        SCTP) goes on to aiortc; an empty one (anyone may send one to the port) is dropped: aiortc would fail on
        it and end the call."""
        if not data:
            return
        srtp = self._dtls._rx_srtp  # (set once DTLS is up)
        if srtp is None or not 127 < data[0] < 192 or is_rtcp(data):
            self._pass_on(data, component)
            return
        try:
            packet = RtpPacket.parse(srtp.unprotect(data))
        except (pylibsrtp.Error, ValueError):  # (not ours, replayed, or damaged: as aiortc, dropped)
            return
        if packet.payload_type == self._payload_type and packet.payload:
            self._heard(packet.sequence_number, packet.payload)

    @property
    def ready(self) -> bool:
        """Whether packets can go: DTLS is up (its keys agreed) and ICE has chosen its pair."""
        return self._dtls.state == "connected" and self._dtls._tx_srtp is not None and 1 in self._connection._nominated

    def send(self, payload: bytes) -> None:
        """Send one 20 ms Opus packet of the model's voice (once :attr:`ready`; a socket gone meanwhile: none)."""
        pair = self._connection._nominated.get(1)
        transport = None if pair is None else pair.protocol.transport
        if transport is None or not self.ready:
            return
        packet = RtpPacket(self._payload_type, int(self._first), self._sequence, self._timestamp, self._ssrc, payload)
        packet.extensions.mid = self._mid
        data = self._dtls._tx_srtp.protect(packet.serialize(self._dtls._rtp_header_extensions_map))
        transport.sendto(data, pair.remote_addr)
        self._first = False
        self._sequence = (self._sequence + 1) & 0xFFFF
        self._timestamp = (self._timestamp + PACKET_TICKS) & 0xFFFFFFFF


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


class Parked(MediaStreamTrack):
    """The track aiortc's own sender is given: it never yields a frame (the voice goes by :class:`RtpAudio`), so
    the sender's task waits without a timer until the connection closes."""

    kind = "audio"

    async def recv(self) -> av.AudioFrame:
        """Never returns (cancelled when the sender stops)."""
        await asyncio.get_running_loop().create_future()
        raise AssertionError("unreachable")
