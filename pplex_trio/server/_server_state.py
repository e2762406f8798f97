"""The server's lifecycle (drawn in ``docs/ARCHITECTURE.md``), and why it cannot take a conversation.

A server is ``SERVING`` from the moment it exists (its engine is built and
warmed before it listens); ``DRAINING`` (SIGTERM with ``--drain-seconds``)
takes no new conversations while the live ones go on; ``STOPPING`` (SIGINT,
a second signal, or the drain's end) closes them all with 1001.
:class:`Unready` is the one answer to "can a conversation start now?": what
``/ready`` says, what ``/health`` reports, the 1001/1013 close reasons and the
503 answers before an upgrade, each with its one message.
"""

from __future__ import annotations

import enum

from .._lifecycle import Lifecycle


class ServerState(enum.Enum):
    """Where the server is in its lifecycle (:data:`SERVER_LIFECYCLE`): serving, draining, or stopping."""

    SERVING = "serving"
    DRAINING = "draining"  # no new conversations; the live ones go on
    STOPPING = "stopping"  # every conversation is being closed (1001)


SERVER_LIFECYCLE = Lifecycle(
    "server",
    ServerState.SERVING,
    {
        ServerState.SERVING: {ServerState.DRAINING, ServerState.STOPPING},
        ServerState.DRAINING: {ServerState.STOPPING},
        ServerState.STOPPING: set(),
    },
)


class Unready(enum.Enum):
    """Why the server cannot take a conversation now; ``value`` is the reason ``/ready`` gives."""

    SHUTTING_DOWN = "shutting_down"
    DRAINING = "draining"
    ENGINE_STALLED = "engine_stalled"
    FULL = "full"

    @property
    def message(self) -> str:
        """What a person (the client, or whoever reads ``/ready``) is told."""
        return _MESSAGES[self]

    @property
    def health(self) -> str:
        """``/health``'s ``status`` in this condition (``ok`` while merely full)."""
        return _HEALTH[self]


_MESSAGES = {
    Unready.SHUTTING_DOWN: "this server is shutting down; connect again (behind a load balancer, to another replica)",
    Unready.DRAINING: "this server is draining and takes no new conversations; connect again (behind a load "
    "balancer, to another replica)",
    Unready.ENGINE_STALLED: "the model engine is stalled and being recovered; try again in a moment",
    Unready.FULL: "every conversation slot and queue place of this server is taken; try again shortly",
}
_HEALTH = {
    Unready.SHUTTING_DOWN: "shutting_down",
    Unready.DRAINING: "draining",
    Unready.ENGINE_STALLED: "stalled",
    Unready.FULL: "ok",
}
