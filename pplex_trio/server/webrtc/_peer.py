"""One WebRTC peer connection (aiortc), on the asyncio loop thread: the offer answered, the caller's audio and
data-channel messages handed out, the model's voice played at real time.

Everything here runs on the asyncio loop (``_asyncio_loop.py``); what it hands out goes through
:class:`PeerEvents`, called on that thread (the Trio side, ``_socket.py``, passes it on to Trio). It touches two
of aiortc's private names, both checked by the tests: the audio receiver's jitter buffer, replaced by
:class:`_Tap` (the packets go to ``_media.OpusIn`` instead: see there why), and its ICE gatherer's connection,
given the configured ports and address (aioice has no setting for either).
"""

from __future__ import annotations

import asyncio
import collections
import fractions
import logging
import random
import socket
from typing import Any, Protocol

import av
import numpy as np
from aioice import Candidate
from aioice.candidate import candidate_foundation, candidate_priority
from aioice.ice import StunProtocol
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCRtpSender, RTCSessionDescription

from ..._conversation import SAMPLE_RATE
from ._media import PACKET_SAMPLES, OpusIn, OpusOut

logger = logging.getLogger(__name__)

CHANNEL = "oai-events"  # the data channel OpenAI's WebRTC clients open for the events
VOICE_QUEUE_PACKETS = 25  # 500 ms of the model's voice waiting to be played: beyond it the oldest goes
_TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)


class PeerEvents(Protocol):
    """What a peer hands out, on the asyncio loop thread."""

    def audio(self, pcm16: bytes) -> None:
        """The caller's audio (PCM16 at 24 kHz), in order, losses concealed."""

    def message(self, text: str | bytes) -> None:
        """A message on the events' data channel."""

    def channel_open(self) -> None:
        """The events' data channel is open: messages can go out."""

    def state(self, ice: str, dtls: str, connection: str) -> None:
        """The connection's states changed (ICE, DTLS, the whole)."""


class PacedVoice(MediaStreamTrack):
    """The model's voice as the peer's outgoing track: 20 ms Opus packets, handed out at real time from the first
    one asked for, silence when none waits (the model's frames come every 80 ms, four packets each)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._frames: collections.deque[np.ndarray] = collections.deque()
        self._start: float | None = None
        self._pts = 0
        self._opus = OpusOut()
        self.dropped = 0  # packets that waited too long and went (counted)

    def push(self, frames: list[np.ndarray]) -> None:
        """Queue 20 ms frames (int16 at 24 kHz) to play; beyond ``VOICE_QUEUE_PACKETS`` the oldest go."""
        self._frames.extend(frames)
        while len(self._frames) > VOICE_QUEUE_PACKETS:
            self._frames.popleft()
            self.dropped += 1

    async def recv(self) -> av.Packet:
        """The next 20 ms packet, once its time has come (aiortc's sender asks for one after the other and sends
        it as it is)."""
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = loop.time()
        else:
            delay = self._start + self._pts / SAMPLE_RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        packet = av.Packet(self._opus(self._frames.popleft()) if self._frames else self._opus.silence)
        packet.pts, packet.time_base = self._pts, _TIME_BASE
        self._pts += PACKET_SAMPLES
        return packet


class _Tap:
    """Stands in for the audio receiver's jitter buffer: aiortc hands it each packet it has checked (codec, RTX,
    statistics for RTCP done), and it passes them to ``OpusIn``, whose audio it plays when its time comes (a timer
    on the loop); nothing reaches aiortc's decoder."""

    def __init__(self, opus: OpusIn, events: PeerEvents) -> None:
        self._opus, self._events = opus, events
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, packet: Any) -> tuple[bool, None]:
        self._opus.packet(packet.sequence_number, packet._data, self._loop.time())
        self._play()
        return False, None

    def _play(self) -> None:
        audio = self._opus.due(self._loop.time())
        if audio:
            self._events.audio(audio)
        if self._timer is not None:
            self._timer.cancel()
        at = self._opus.next_due()
        self._timer = None if at is None else self._loop.call_at(at, self._play)

    def stop(self) -> None:
        """No more timers (the connection is closing)."""
        if self._timer is not None:
            self._timer.cancel()


class Peer:
    """One peer connection: :meth:`answer` an offer, then audio and messages both ways until :meth:`close`."""

    def __init__(self, events: PeerEvents, *, ports: range | None = None, host: str | None = None) -> None:
        self._events = events
        self._ports, self._host = ports, host
        self._pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # (no STUN: the server's address is known)
        self.voice = PacedVoice()
        self.opus = OpusIn()
        self._channel: Any = None
        self._media: Any = None  # the DTLS transport the audio rides on (and the data channel: one bundle)
        self._tap: _Tap | None = None
        self._pc.on("datachannel", self._on_channel)
        self._pc.on("connectionstatechange", self._on_state)
        self._pc.on("iceconnectionstatechange", self._on_state)

    @property
    def channel_open(self) -> bool:
        """Whether the events' data channel is open (messages said before wait for it)."""
        return self._channel is not None and self._channel.readyState == "open"

    @property
    def buffered(self) -> int:
        """Bytes of messages queued on the data channel, not yet sent (a peer that does not read lets it grow)."""
        return 0 if self._channel is None else int(self._channel.bufferedAmount)

    async def answer(self, offer: str) -> str:
        """Take the caller's ``offer`` (checked already) and give the answer: Opus both ways, the data channel."""
        pc = self._pc
        await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
        audio = next(t for t in pc.getTransceivers() if t.kind == "audio")
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
        audio.setCodecPreferences(opus)
        audio.direction = "sendrecv"
        audio.sender.replaceTrack(self.voice)
        receiver: Any = audio.receiver
        receiver._RTCRtpReceiver__jitter_buffer = self._tap = _Tap(self.opus, self._events)
        self._media = audio.receiver.transport
        for transport in {audio.receiver.transport, *([pc.sctp.transport] if pc.sctp else [])}:
            _place(transport.transport.iceGatherer, self._ports, self._host)
        await pc.setLocalDescription(await pc.createAnswer())
        return str(pc.localDescription.sdp)

    def send(self, text: str) -> None:
        """Put ``text`` on the data channel (the caller of a peer whose channel is not open waits for it)."""
        if self._channel is not None and self._channel.readyState == "open":
            self._channel.send(text)

    def _on_channel(self, channel: Any) -> None:
        if channel.label != CHANNEL or self._channel is not None:
            channel.close()  # (one events channel per call; others are not ours to serve)
            return
        self._channel = channel
        channel.on("message", self._events.message)

        def opened() -> None:
            self._events.channel_open()

        if channel.readyState == "open":
            opened()
        else:
            channel.on("open", opened)
        channel.on("close", lambda: self._on_state())

    def _on_state(self) -> None:
        pc = self._pc
        dtls = self._media.state if self._media is not None else "new"
        if self._channel is not None and self._channel.readyState == "closed" and pc.connectionState == "connected":
            dtls = "closed"  # the caller closed the events channel: the call is over
        self._events.state(pc.iceConnectionState, dtls, pc.connectionState)

    async def close(self) -> None:
        """Close the connection (its sockets and tasks); once is enough, twice is harmless."""
        if self._tap is not None:
            self._tap.stop()
        await self._pc.close()


def _place(gatherer: Any, ports: range | None, host: str | None) -> None:
    """Bind the gatherer's one candidate to a port of ``ports`` on every interface and announce ``host`` as its
    address (``ports`` None: a port of the kernel's; ``host`` None: the first IPv4 address of the machine). Both
    None: aioice's own choice, a candidate on each interface."""
    if ports is None and host is None:
        return
    connection = gatherer._connection

    async def candidates(component: int, addresses: list[str], timeout: int = 5) -> list[Any]:
        loop = asyncio.get_running_loop()
        for port in random.sample(ports, len(ports)) if ports is not None else [0]:
            try:
                transport, protocol = await loop.create_datagram_endpoint(
                    lambda: StunProtocol(connection), local_addr=("0.0.0.0", port), family=socket.AF_INET
                )
            except OSError:
                continue
            address = host or next((a for a in addresses if ":" not in a), "127.0.0.1")
            protocol.local_candidate = Candidate(
                foundation=candidate_foundation("host", "udp", address),
                component=component,
                transport="udp",
                priority=candidate_priority(component, "host"),
                host=address,
                port=transport.get_extra_info("sockname")[1],
                type="host",
            )
            connection._protocols.append(protocol)
            return [protocol.local_candidate]
        assert ports is not None
        raise OSError(f"no free UDP port in {ports.start}-{ports.stop - 1} for a WebRTC call")

    connection.get_component_candidates = candidates
