"""A lossy, jittery UDP relay between a WebRTC caller and the server, on a thread (this kernel has no netem).

The relay has two sockets on 127.0.0.1: ``caller_side`` (the caller sends to it, as to the server) and
``server_side`` (the server sends to it, as to the caller). A call goes through it once both descriptions are
rewritten: :meth:`UdpRelay.offer` replaces the caller's candidates by one at ``server_side`` and remembers the
caller's own address; :meth:`UdpRelay.answer` replaces the server's by one at ``caller_side`` and remembers the
server's. Neither end then knows the other's real address, so every packet (ICE checks, DTLS, RTP, SCTP) takes
the relay: with only the answer rewritten the server would check the caller's real candidates directly and the
media could bypass the relay. What comes from the caller goes on to the server; what comes from the server goes
back to the address the caller was last heard from (its real candidate until then).

Each direction has its own seeded random loss (each datagram dropped with probability ``loss``) and jitter (each
datagram held a random 0..``jitter`` seconds, so datagrams may overtake each other). What happened is counted
per direction (``up``: caller → server, ``down``), RTP packets apart (RFC 7983: first byte 128..191, RTCP's
packet types 192..223 excluded).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import re
import selectors
import socket
import threading
import time

Address = tuple[str, int]
_CANDIDATE = re.compile(r"^a=candidate:\S+ 1 udp \d+ (\d+\.\d+\.\d+\.\d+) (\d+) typ host", re.MULTILINE)


@dataclasses.dataclass
class Direction:
    """One direction's settings and what became of its datagrams."""

    loss: float = 0.0  # probability each datagram is dropped
    jitter: float = 0.0  # each datagram held uniformly 0..jitter seconds
    forwarded: int = 0
    dropped: int = 0
    rtp_forwarded: int = 0
    rtp_dropped: int = 0
    rtp_first: int | None = None  # the first RTP packet's sequence number
    rtp_dropped_numbers: list[int] = dataclasses.field(default_factory=list)  # the dropped ones', in order
    delays: list[float] = dataclasses.field(default_factory=list)  # the hold chosen for each forwarded datagram
    rtp_overtaken: int = 0  # RTP packets that went out after one numbered later (reordered by the jitter)
    _newest: int | None = None  # the latest RTP sequence number sent on (mod 2**16)

    @property
    def rtp_sent(self) -> int:
        """RTP packets that came to the relay this way (forwarded or not)."""
        return self.rtp_forwarded + self.rtp_dropped


def is_rtp(datagram: bytes) -> bool:
    """An RTP packet (not RTCP, STUN, DTLS), as RFC 7983 tells them apart."""
    return len(datagram) >= 12 and 128 <= datagram[0] <= 191 and not 192 <= datagram[1] <= 223


def _one_candidate(sdp: str, address: Address) -> tuple[str, Address]:
    """``sdp`` with its candidates replaced by one host candidate at ``address``; the first IPv4 UDP host
    candidate it had."""
    found = _CANDIDATE.search(sdp)
    assert found, f"no IPv4 UDP host candidate in:\n{sdp}"
    real = (found.group(1), int(found.group(2)))
    ours = f"a=candidate:1 1 udp 2130706431 {address[0]} {address[1]} typ host"
    out: list[str] = []
    placed = False  # (one candidate per media section, where its first one was)
    for line in sdp.splitlines():
        if line.startswith("m="):
            placed = False
        if line.startswith("a=candidate:"):
            if not placed:
                out.append(ours)
            placed = True
        else:
            out.append(line)
    text = "\r\n".join(out) + "\r\n"
    # The c= lines and the default candidate's port name the relay too (some stacks read them).
    text = re.sub(r"^c=IN IP4 \S+", f"c=IN IP4 {address[0]}", text, flags=re.MULTILINE)
    text = re.sub(r"^(m=\S+) \d+ ", rf"\g<1> {address[1]} ", text, flags=re.MULTILINE)
    return text, real


class UdpRelay:
    """``UdpRelay(up=Direction(loss=0.05, jitter=0.04), seed=1)``: see the module's doc. Close it when done."""

    def __init__(self, *, up: Direction | None = None, down: Direction | None = None, seed: int = 0) -> None:
        self.up, self.down = up or Direction(), down or Direction()
        self._random = random.Random(seed)
        self.caller_side = self._socket()
        self.server_side = self._socket()
        self.caller: Address | None = None  # where the caller is (its candidate, then where it was last heard from)
        self.server: Address | None = None  # the server's real candidate
        self._held: list[tuple[float, int, socket.socket, bytes]] = []  # (when due, order, via, datagram)
        self._order = itertools.count()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="udp-relay", daemon=True)
        self._thread.start()

    @staticmethod
    def _socket() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        return sock

    def offer(self, sdp: str) -> str:
        """The caller's offer as the server should see it: the caller is at the relay's ``server_side``. An offer
        without candidates (a browser's, made before it gathered any) goes as it is: the server learns the
        caller's address from its checks, which come from the relay."""
        if "a=candidate:" not in sdp:
            return sdp
        text, self.caller = _one_candidate(sdp, self.server_side.getsockname())
        return text

    def answer(self, sdp: str) -> str:
        """The server's answer as the caller should see it: the server is at the relay's ``caller_side``."""
        text, self.server = _one_candidate(sdp, self.caller_side.getsockname())
        return text

    def close(self) -> None:
        """Stop the thread and close the sockets (what is still held is dropped)."""
        self._stop = True
        self._wake_w.send(b"!")
        self._thread.join(5)
        for sock in (self.caller_side, self.server_side, self._wake_r, self._wake_w):
            sock.close()

    def __enter__(self) -> UdpRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the relay's thread ---------------------------------------------------------

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.caller_side, selectors.EVENT_READ, "up")
        selector.register(self.server_side, selectors.EVENT_READ, "down")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        while not self._stop:
            timeout = max(0.0, self._held[0][0] - time.monotonic()) if self._held else None
            for key, _ in selector.select(timeout):
                if key.data == "wake":
                    self._wake_r.recv(64)
                else:
                    self._read(key.fileobj, key.data)  # type: ignore[arg-type]
            self._send_due()
        selector.close()

    def _read(self, sock: socket.socket, way: str) -> None:
        while True:
            try:
                data, source = sock.recvfrom(65536)
            except (BlockingIOError, ConnectionRefusedError):
                return
            if way == "up":
                self.caller = source
                self._pass(self.up, data, self.server_side)
            else:
                self._pass(self.down, data, self.caller_side)

    def _pass(self, direction: Direction, data: bytes, via: socket.socket) -> None:
        rtp = is_rtp(data)
        sequence = int.from_bytes(data[2:4], "big") if rtp else None  # (RTP's, in clear under SRTP)
        if direction.rtp_first is None:
            direction.rtp_first = sequence
        if direction.loss and self._random.random() < direction.loss:
            direction.dropped += 1
            direction.rtp_dropped += rtp
            if sequence is not None:
                direction.rtp_dropped_numbers.append(sequence)
            return
        delay = self._random.uniform(0, direction.jitter) if direction.jitter else 0.0
        direction.forwarded += 1
        direction.rtp_forwarded += rtp
        direction.delays.append(delay)
        heapq.heappush(self._held, (time.monotonic() + delay, next(self._order), via, data))

    @staticmethod
    def _order_of(direction: Direction, data: bytes) -> None:
        if not is_rtp(data):
            return
        sequence = int.from_bytes(data[2:4], "big")
        if direction._newest is not None and 0 < (direction._newest - sequence) & 0xFFFF < 0x8000:
            direction.rtp_overtaken += 1
        else:
            direction._newest = sequence

    def _send_due(self) -> None:
        now = time.monotonic()
        while self._held and self._held[0][0] <= now:
            _, _, via, data = heapq.heappop(self._held)
            self._order_of(self.up if via is self.server_side else self.down, data)
            to = self.server if via is self.server_side else self.caller
            if to is not None:
                try:
                    via.sendto(data, to)
                except OSError:  # (the far end is gone: as a network would, say nothing)
                    pass
