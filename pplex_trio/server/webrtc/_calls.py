"""The server's WebRTC calls: where a call's peer connection and its session live, from its offer to its end.

:class:`CallDesk` runs for as long as the server (``serve`` starts it). Its first call starts the asyncio loop
thread aiortc runs on (``_asyncio_loop.py``: a server that takes no WebRTC call never starts one); every call is a
Trio task in the desk's nursery, inside the loop's block, so a peer connection lives exactly as long as its
session, and the loop thread and every UDP socket are gone when the desk's task ends:

    offer → PeerSocket.answer → the call's task: session.run() over the socket → the peer is closed

The desk knows nothing of sessions: the route hands it ``converse(socket)``, which runs one.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from ._asyncio_loop import AsyncioLoop, open_asyncio_loop
from ._end import EndReason

if TYPE_CHECKING:
    from ._socket import PeerSocket

logger = logging.getLogger(__name__)


class CallRefused(Exception):
    """A call the desk cannot take: its ``status`` (an HTTP status) and a message that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class CallDesk:
    """The WebRTC calls of one server (see the module's doc); :meth:`run` is its task."""

    def __init__(
        self,
        *,
        ports: range | None,
        host: str | None,
        max_message_bytes: int,
        on_end: Callable[[EndReason], None] = lambda reason: None,
        on_packets: Callable[[str, int], None] = lambda kind, count: None,
    ) -> None:
        self._ports, self._host = ports, host
        self._max_message_bytes = max_message_bytes
        self._on_end, self._on_packets = on_end, on_packets
        self.calls: dict[str, PeerSocket] = {}  # by call id, while they run
        self._nursery: trio.Nursery | None = None
        self._loop: AsyncioLoop | None = None
        self._calls: trio.Nursery | None = None
        self._starting = trio.Lock()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the calls until cancelled (then every call ends, its peer closed, and the loop thread stops)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def open(
        self,
        offer: str,
        converse: Callable[[PeerSocket], Awaitable[Any]],
        *,
        client: str | None,
        prefix: str = "",
        call_id: str | None = None,
    ) -> tuple[str, str]:
        """Answer ``offer`` and start the call (``converse(socket)`` runs its session): its id (``call_id``, else
        ``prefix`` and 24 random hex digits) and the answer. ``CallRefused`` when the desk is closed or the peer
        cannot answer."""
        try:  # (aiortc and PyAV load with the first call: a server without one never does)
            from ._socket import PeerSocket
        except ImportError as exc:  # (the [webrtc] extra is not installed)
            raise CallRefused(501, f"this server has no WebRTC ({exc}): install pplex-trio[webrtc]") from None

        calls, loop = await self._started()
        socket = PeerSocket(
            loop,
            client=client,
            max_message_bytes=self._max_message_bytes,
            ports=self._ports,
            host=self._host,
            on_packets=self._on_packets,
        )
        try:
            answer = await socket.answer(offer)
        except OSError as exc:  # (no free port in the range, say)
            await socket.close_peer()
            raise CallRefused(503, str(exc)) from None
        except ValueError as exc:  # what aiortc cannot take of an offer the checks let through
            await socket.close_peer()
            raise CallRefused(400, f"the SDP offer cannot be answered: {exc}") from None
        call_id = call_id or f"{prefix}{secrets.token_hex(12)}"
        self.calls[call_id] = socket
        calls.start_soon(self._run_call, call_id, socket, converse)
        return call_id, answer

    async def restart(self, call_id: str, offer: str) -> str | None:
        """A new ``offer`` for call ``call_id`` (an ICE restart): the answer, or None for no such call."""
        socket = self.calls.get(call_id)
        if socket is None:
            return None
        try:
            return await socket.restart(offer)
        except OSError as exc:
            raise CallRefused(503, str(exc)) from None
        except ValueError as exc:
            raise CallRefused(400, f"the SDP offer cannot be answered: {exc}") from None

    def hang_up(self, call_id: str) -> bool:
        """End call ``call_id`` now (False: no such call)."""
        socket = self.calls.get(call_id)
        if socket is not None:
            socket.lost(EndReason.HANGUP)
        return socket is not None

    async def _started(self) -> tuple[trio.Nursery, AsyncioLoop]:
        async with self._starting:
            if self._nursery is None:
                raise CallRefused(503, "the server is not taking WebRTC calls (it is stopping)")
            if self._calls is None:
                await self._nursery.start(self._hold_calls)
        assert self._calls is not None and self._loop is not None
        return self._calls, self._loop

    async def _hold_calls(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with open_asyncio_loop(name="webrtc") as loop, trio.open_nursery() as calls:
                self._loop, self._calls = loop, calls
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = self._calls = self._loop = None

    async def _run_call(
        self, call_id: str, socket: PeerSocket, converse: Callable[[PeerSocket], Awaitable[Any]]
    ) -> None:
        try:
            with socket.disconnected:
                await converse(socket)
        except Exception:  # (a bug met in one call ends that call, never the desk and the others)
            logger.exception("WebRTC call %s: internal error", call_id)
        finally:
            if socket.ending is None:
                socket.ending = EndReason.SHUTDOWN
            await socket.close_peer()
            del self.calls[call_id]
            logger.info("WebRTC call %s ended: %s", call_id, socket.ending.value)
            self._on_end(socket.ending)
