"""One WebRTC peer connection (aiortc), on the asyncio loop thread: the offer answered, the caller's audio and
data-channel messages handed out, the model's voice played at real time.

Everything here runs on the asyncio loop (``_asyncio_loop.py``); what it hands out goes through
:class:`PeerEvents`, called on that thread (the Trio side, ``_socket.py``, passes it on to Trio). The audio
packets bypass aiortc's media path (``_rtp.py``: see there why); the caller's are played by ``_media.OpusIn``'s
own jitter buffer (see there why not aiortc's), at the ticks of the loop's one clock (``_rtp.CallClock``). Beside
``_rtp.py``'s, one private name of aioice's is touched: its ICE gatherer's connection, given the configured ports
and address (aioice has no setting for either).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from typing import Any, Protocol

from aioice import Candidate
from aioice.candidate import candidate_foundation, candidate_priority
from aioice.ice import StunProtocol
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription

from ._media import OpusIn, Voice
from ._rtp import CallClock, RtpAudio

logger = logging.getLogger(__name__)

CHANNEL = "oai-events"  # the data channel OpenAI's WebRTC clients open for the events


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


class Peer:
    """One peer connection: :meth:`answer` an offer, then audio and messages both ways until :meth:`close`."""

    def __init__(self, events: PeerEvents, *, ports: range | None = None, host: str | None = None) -> None:
        self._events = events
        self._ports, self._host = ports, host
        self._pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # (no STUN: the server's address is known)
        self.voice = Voice()
        self.opus = OpusIn()
        self._channel: Any = None
        self._media: Any = None  # the DTLS transport the audio rides on (and the data channel: one bundle)
        self._rtp: RtpAudio | None = None
        self._clock: CallClock | None = None
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
        audio.direction = "sendrecv"
        self._media = audio.receiver.transport
        for transport in {audio.receiver.transport, *([pc.sctp.transport] if pc.sctp else [])}:
            _place(transport.transport.iceGatherer, self._ports, self._host)
        await pc.setLocalDescription(_opus_only(await pc.createAnswer()))
        answer = str(pc.localDescription.sdp)
        self._rtp = RtpAudio(audio.sender, answer, self._heard)
        self._clock = CallClock.of_running_loop()
        self._clock.add(self, self._tick)
        return answer

    def _heard(self, sequence: int, payload: bytes) -> None:
        """One of the caller's packets, as it came."""
        self.opus.packet(sequence, payload, asyncio.get_running_loop().time())

    def _tick(self, now: float) -> None:
        """The call's turn on the loop's clock: the voice's next packet goes, the caller's audio whose time has
        come is handed out."""
        assert self._rtp is not None
        if self._rtp.ready:
            self._rtp.send(self.voice.next_packet(), now)
        audio = self.opus.due(now)
        if audio:
            self._events.audio(audio)

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
        if self._clock is not None:
            self._clock.remove(self)
            self._clock = None
        if self._rtp is not None:
            self._rtp.close()
            self._rtp = None
        await self._pc.close()


def _opus_only(answer: RTCSessionDescription) -> RTCSessionDescription:
    """``answer`` with its audio in Opus alone (aiortc would also list the other codecs it knows, which the call's
    audio path does not decode), in-band FEC asked for (RFC 7587's ``useinbandfec=1``: a browser sends none without
    it, and then as much as the losses our reports tell call for)."""
    description = SessionDescription.parse(answer.sdp)
    for media in description.media:
        if media.kind == "audio":
            opus = next(c for c in media.rtp.codecs if c.mimeType.lower() == "audio/opus")  # (the offer was checked)
            opus.parameters = {**opus.parameters, "minptime": 10, "useinbandfec": 1}
            media.rtp.codecs, media.fmt = [opus], [opus.payloadType]
    return RTCSessionDescription(str(description), answer.type)


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
