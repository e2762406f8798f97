"""A WebRTC call as the session core sees a connection: a :class:`PeerSocket` (``sessions._wire.WebSocket``).

``receive`` gives the data channel's messages (``str``) and the caller's audio (``bytes``: PCM16 at 24 kHz,
``_media.OpusIn``'s); ``send`` puts ``str`` on the data channel and plays ``bytes`` (the model's PCM16 at 24 kHz)
on the outgoing track. The session core runs unchanged over it; the WebRTC adapters of the OpenAI protocols
(``sessions``) say which messages are audio.

The peer connection lives on the asyncio loop thread (``_peer.py``); what it hands out comes to Trio through
``AsyncioLoop.to_trio``, what goes to it through ``AsyncioLoop.call_soon``: neither side ever waits for the
other. A call survives a change of network: :meth:`PeerSocket.restart` answers a new offer with a new peer
connection and the call goes on over it (the old one is closed).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import trio

from ..._conversation import CloseCode
from ...protocol import ProtocolError
from ._asyncio_loop import AsyncioLoop
from ._end import EndReason
from ._media import InputCounts, VoiceOut
from ._peer import Peer

# Data-channel events: a burst of this many, then this many a second, at most; beyond, the caller floods us (1008).
EVENT_BURST = 256
EVENTS_PER_SECOND = 100
MAX_WAITING_AUDIO = 50  # caller audio waiting (1 s of 20 ms packets): beyond, the oldest goes ("dropped")
MAX_BUFFERED_BYTES = 1 << 20  # events queued on the data channel for a caller that does not read them
COUNT_EVERY = 25  # the caller's packets are counted in /metrics every this many (half a second)
CLOSE_FLUSH_SECONDS = 1.0  # how long the last events (why the call ends) may take to leave before the close


class PeerSocket:
    """One call's connection, over its current peer (see the module's doc)."""

    def __init__(
        self,
        loop: AsyncioLoop,
        *,
        client: str | None,
        max_message_bytes: int,
        ports: range | None,
        host: str | None,
        on_packets: Callable[[str, int], None] = lambda kind, count: None,
    ) -> None:
        self.query_string = b""
        self.client = client
        self.disconnected = trio.CancelScope()  # cancelled when the caller is gone (the session core's contract)
        self.ending: EndReason | None = None
        self._loop = loop
        self._max_message_bytes = max_message_bytes
        self._ports, self._host = ports, host
        self._on_packets = on_packets  # counts the caller's packets by kind (InputCounts' fields)
        self._counted = InputCounts()  # what has been counted of the current peer's
        self._messages: collections.deque[str | bytes] = collections.deque()
        self._audio: collections.deque[bytes] = collections.deque()
        self._changed = trio.Event()
        self._flooded = False
        self._came_up: set[str] = set()  # what of the current peer's connection came up: "ice", "dtls"
        self._allowance, self._counted_at = float(EVENT_BURST), trio.current_time()  # (the events' token bucket)
        self._unsent: list[str] = []  # events said before the channel opened
        self._voice = VoiceOut()
        self.peer = self._new_peer()

    # -- the peer ------------------------------------------------------------------

    def _new_peer(self) -> Peer:
        hand = _Hand(self)
        peer = Peer(hand, ports=self._ports, host=self._host)
        hand.peer = peer
        return peer

    async def answer(self, offer: str) -> str:
        """The answer to the call's first ``offer`` (its peer gathers its candidates meanwhile)."""
        return await self._loop.run(self.peer.answer, offer)

    async def restart(self, offer: str) -> str:
        """A new ``offer`` for this call (the caller's network changed: an ICE restart): a new peer answers it and
        the call goes on over it; the old one is closed."""
        self._count_packets(now=True)
        old, came_up = self.peer, self._came_up
        self.peer, self._came_up = self._new_peer(), set()
        try:
            answer = await self._loop.run(self.peer.answer, offer)
        except BaseException:
            new, self.peer, self._came_up = self.peer, old, came_up
            with trio.CancelScope(shield=True):
                await self._loop.run(new.close)
            raise
        self._counted = InputCounts()
        with trio.CancelScope(shield=True):
            await self._loop.run(old.close)
        return answer

    def _from_peer(self, peer: Peer, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on Trio's thread for ``peer``'s event, unless ``peer`` has been replaced since."""

        def deliver() -> None:
            if peer is self.peer:
                fn(*args)

        self._loop.to_trio(deliver)

    def _heard(self, pcm16: bytes) -> None:
        if len(self._audio) >= MAX_WAITING_AUDIO:
            self._audio.popleft()
            self._on_packets("dropped", 1)
        self._audio.append(pcm16)
        self._wake()

    def _got(self, message: str | bytes) -> None:
        now = trio.current_time()
        self._allowance = min(EVENT_BURST, self._allowance + (now - self._counted_at) * EVENTS_PER_SECOND)
        self._counted_at = now
        if self._allowance < 1:
            self._flooded = True
        else:
            self._allowance -= 1
            self._messages.append(message)
        self._wake()

    def _event(self, message: str | bytes) -> str:
        """A data-channel message as the text of an event (a binary one must be UTF-8 too: ``bytes`` from
        :meth:`receive` are the caller's audio)."""
        if len(message) > self._max_message_bytes:
            raise ProtocolError(
                f"an event over {self._max_message_bytes} bytes on the data channel", CloseCode.MESSAGE_TOO_BIG
            )
        if isinstance(message, str):
            return message
        try:
            return message.decode()
        except UnicodeDecodeError:
            raise ProtocolError("a data-channel message that is not UTF-8 text", CloseCode.INVALID_PAYLOAD) from None

    def _opened(self) -> None:
        unsent, self._unsent = self._unsent, []
        for text in unsent:
            self._loop.call_soon(self.peer.send, text)

    def _states(self, ice: str, dtls: str, connection: str) -> None:
        self._came_up |= {"ice"} if ice in ("connected", "completed") else set()
        self._came_up |= {"dtls"} if dtls == "connected" else set()
        reason = _judge(ice, dtls, connection)
        if reason is not None:
            self.lost(reason)

    def lost(self, reason: EndReason) -> None:
        """The call's connection is over (``reason``): the session is cancelled, as for a WebSocket that drops."""
        if self.ending is None:
            self.ending = reason
        self.disconnected.cancel()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- what the session core calls ----------------------------------------------

    async def accept(self, subprotocol: str | None = None) -> None:
        """Nothing to do: the call was answered when its offer was."""

    async def receive(self) -> bytes | str:
        """The next data-channel message, else the caller's next audio (PCM16 at 24 kHz); once the call is
        closed, nothing more (the peer's end cancels the reader, as a WebSocket's disconnect does)."""
        while True:
            if self.ending is not None:
                await trio.sleep_forever()
            if self._flooded:
                raise ProtocolError(
                    f"more than {EVENTS_PER_SECOND} events a second on the data channel; slow down", CloseCode.POLICY
                )
            if self._messages:
                return self._event(self._messages.popleft())
            if self._audio:
                self._count_packets()
                return self._audio.popleft()
            await self._changed.wait()

    def _count_packets(self, *, now: bool = False) -> None:
        """Count the current peer's packets in /metrics: every ``COUNT_EVERY`` (lighter on the audio path), or
        ``now`` (its last, before it goes)."""
        counts, counted = self.peer.opus.counts, self._counted
        if not now and counted.received > 0 and counts.received - counted.received < COUNT_EVERY:
            return
        if counts != counted:  # (a dataclass's == compares its fields)
            for kind in (field.name for field in dataclasses.fields(counts)):
                if (new := getattr(counts, kind) - getattr(counted, kind)) > 0:
                    self._on_packets(kind, new)
            self._counted = dataclasses.replace(counts)

    async def send(self, data: bytes | str) -> None:
        """``str``: an event on the data channel (waiting while a caller that does not read lets more than
        ``MAX_BUFFERED_BYTES`` pile up: the session's write deadline then ends the call); ``bytes``: the model's
        PCM16 at 24 kHz, played at real time."""
        if isinstance(data, bytes):
            self._loop.call_soon(self.peer.voice.push, self._voice(data))
            return
        while self.peer.buffered > MAX_BUFFERED_BYTES:
            await trio.sleep(0.05)
        if self._unsent or not self.peer.channel_open:
            self._unsent.append(data)
        else:
            self._loop.call_soon(self.peer.send, data)

    async def close(self, code: int, reason: str = "") -> None:
        """End the call: what was said leaves first (``CLOSE_FLUSH_SECONDS`` at most), then the peer closes."""
        if self.ending is None:  # the session ended it; before the network was up, the network is why
            up = self._came_up
            self.ending = (
                EndReason.SESSION if "dtls" in up else EndReason.DTLS_FAILED if "ice" in up else EndReason.ICE_FAILED
            )
        with trio.move_on_after(CLOSE_FLUSH_SECONDS):
            while self.peer.buffered or self._unsent and self.peer.channel_open:
                await trio.sleep(0.02)
        self.disconnected.cancel()  # (no close handshake to wait for: the call is over)

    async def close_peer(self) -> None:
        """Close the peer connection (shielded: its sockets go whatever cancels the call)."""
        self._count_packets(now=True)
        with trio.CancelScope(shield=True):
            await self._loop.run(self.peer.close)


class _Hand:
    """A peer's :class:`~._peer.PeerEvents`, handed on to its socket on Trio's thread."""

    def __init__(self, socket: PeerSocket) -> None:
        self._socket = socket
        self.peer: Peer | None = None

    def _pass(self, fn: Callable[..., None], *args: Any) -> None:
        assert self.peer is not None
        self._socket._from_peer(self.peer, fn, *args)

    def audio(self, pcm16: bytes) -> None:
        self._pass(self._socket._heard, pcm16)

    def message(self, text: str | bytes) -> None:
        self._pass(self._socket._got, text)

    def channel_open(self) -> None:
        self._pass(self._socket._opened)

    def state(self, ice: str, dtls: str, connection: str) -> None:
        self._pass(self._socket._states, ice, dtls, connection)


def _judge(ice: str, dtls: str, connection: str) -> EndReason | None:
    """Why a connection in these states is over, None while it is not."""
    if dtls == "failed":
        return EndReason.DTLS_FAILED
    if ice == "failed" or (ice == "closed" and connection != "closed"):
        return EndReason.ICE_FAILED if dtls in ("new", "connecting") else EndReason.CONSENT_EXPIRED
    if dtls == "closed" or connection in ("closed", "failed"):
        return EndReason.PEER_CLOSED
    return None
