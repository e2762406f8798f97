"""The server's lifecycle (``ServerState``) and its one answer to "can a conversation start now?" (``Unready``)."""

from __future__ import annotations

import contextlib

import pytest
import trio

from _helpers.fake_ws import make_host
from pplex_trio._conversation import Conversation
from pplex_trio.engine import ActorState
from pplex_trio.server._server_state import SERVER_LIFECYCLE, ServerState, Unready


def test_the_lifecycle_only_moves_forward():
    S, D, X = ServerState.SERVING, ServerState.DRAINING, ServerState.STOPPING
    allowed = {(S, D), (S, X), (D, X)}
    for a in ServerState:
        for b in ServerState:
            assert SERVER_LIFECYCLE.allows(a, b) == ((a, b) in allowed), (a, b)


async def test_a_drain_then_a_shutdown_each_happen_once_and_a_stopping_server_never_drains(monkeypatch):
    host = make_host(monkeypatch)
    assert host.state is ServerState.SERVING and host.unready() is None
    scope = trio.CancelScope()
    assert host.begin_drain(scope) and host.state is ServerState.DRAINING
    assert not host.begin_drain(trio.CancelScope())  # a second drain: no
    host.end_drain()
    assert scope.cancel_called
    assert host.begin_shutdown() and host.state is ServerState.STOPPING
    assert not host.begin_shutdown() and not host.begin_drain(trio.CancelScope())
    assert host.state is ServerState.STOPPING


@pytest.mark.parametrize(
    "state, stalled, full, ready, health",
    [
        (ServerState.SERVING, False, False, None, "ok"),
        (ServerState.SERVING, False, True, "full", "ok"),
        (ServerState.SERVING, True, True, "engine_stalled", "stalled"),
        (ServerState.DRAINING, True, True, "draining", "draining"),
        (ServerState.STOPPING, True, True, "shutting_down", "shutting_down"),
    ],
)
async def test_one_answer_in_one_order_for_ready_health_and_refusals(state, stalled, full, ready, health, monkeypatch):
    host = make_host(monkeypatch, slots=1, queue_size=0)
    host.state = state
    if stalled:
        host.actor.state = ActorState.STALLED  # (an engine call past engine_timeout: test_actor.py moves it so)
    with contextlib.ExitStack() as stack:
        if full:
            stack.enter_context(host.actor.lease(Conversation()))  # the one slot taken; no queue
        check(host, ready, health)


def check(host, ready, health):
    unready = host.unready()
    assert (None if unready is None else unready.value) == ready
    refusal = host.unready(when_full=False)
    assert ("ok" if refusal is None else refusal.health) == health
    if unready is not None:
        assert unready.message and len(unready.message.encode()) <= 123  # fits a WebSocket close reason


def test_every_reason_has_its_message():
    assert {u.value for u in Unready} == {"shutting_down", "draining", "engine_stalled", "full"}
    assert all(u.message.endswith(("replica)", "moment", "shortly")) for u in Unready)
