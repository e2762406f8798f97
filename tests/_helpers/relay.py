"""A TCP relay in front of a test server, on a thread, that can cut every connection through it at once.

The browser talks to the relay's port; the relay copies bytes both ways.  :meth:`Relay.drop` resets
every connection it carries (SO_LINGER 0: an RST to both sides, as a lost network or a recycled proxy
does), and goes on accepting new ones.  One thread and one selector own every socket, so a reset is
sent at once (a socket closed under another thread's ``recv`` would linger until that returns).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading


class Relay:
    """``Relay(upstream_port)`` on 127.0.0.1; ``url`` is its address, ``drop()`` cuts all."""

    def __init__(self, upstream_port: int):
        self._upstream = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._orders: list[str] = []  # "drop" or "close", for the relay's thread
        self._done = threading.Event()
        self._peers: dict[socket.socket, socket.socket] = {}
        self.connections = 0  # accepted so far
        self.drops = 0  # connections reset by drop()
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop(self) -> None:
        """Reset every connection under way (both sides see a reset, no close frame); returns once done."""
        self._order("drop")

    def close(self) -> None:
        """Stop accepting and cut what remains."""
        self._order("close")
        self._thread.join(5)
        self._wake_w.close()

    def _order(self, what: str) -> None:
        self._done.clear()
        self._orders.append(what)
        self._wake_w.send(b"!")
        self._done.wait(5)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ, "accept")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in selector.select():
                if key.data == "accept":
                    self._accept(selector)
                elif key.data == "wake":
                    self._wake_r.recv(64)
                    while self._orders:
                        order = self._orders.pop(0)
                        self.drops += self._reset_all(selector)
                        if order == "close":
                            selector.close()
                            self._listener.close()
                            self._wake_r.close()
                            self._done.set()
                            return
                    self._done.set()
                elif key.fileobj in self._peers:
                    self._copy(selector, key.fileobj)  # type: ignore[arg-type]

    def _accept(self, selector: selectors.BaseSelector) -> None:
        with contextlib.suppress(BlockingIOError):
            client, _ = self._listener.accept()
            try:
                server = socket.create_connection(("127.0.0.1", self._upstream))
            except OSError:
                client.close()
                return
            self.connections += 1
            for sock, peer in ((client, server), (server, client)):
                sock.setblocking(True)  # writes block briefly; reads only follow the selector
                self._peers[sock] = peer
                selector.register(sock, selectors.EVENT_READ, "copy")

    def _copy(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        peer = self._peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        # One side ended: end the other (a reset stays a reset: the kernel told the peer already).
        for s in (sock, peer):
            self._peers.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(s)
            s.close()

    def _reset_all(self, selector: selectors.BaseSelector) -> int:
        sockets = list(self._peers)
        self._peers.clear()
        for sock in sockets:
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(sock)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        return len(sockets) // 2
