"""The server's lifecycle (``ServerPhase``) and its one answer to "can a conversation start now?" (``Unready``)."""

from __future__ import annotations

import contextlib

import pytest
import trio

from pplex_trio._conversation import Conversation
from pplex_trio.server._phase import ServerPhase, Unready

from _helpers.fake_ws import make_host


def test_the_lifecycle_only_moves_forward():
    S, D, X = ServerPhase.SERVING, ServerPhase.DRAINING, ServerPhase.STOPPING
    allowed = {(S, D), (S, X), (D, X)}
    for a in ServerPhase:
        for b in ServerPhase:
            assert a.can_become(b) == ((a, b) in allowed), (a, b)


def test_a_drain_then_a_shutdown_each_happen_once_and_a_stopping_server_never_drains():
    host = make_host()
    assert host.phase is ServerPhase.SERVING and host.unready() is None
    scope = trio.CancelScope()
    assert host.begin_drain(scope) and host.phase is ServerPhase.DRAINING
    assert not host.begin_drain(trio.CancelScope())  # a second drain: no
    host.end_drain()
    assert scope.cancel_called
    assert host.begin_shutdown() and host.phase is ServerPhase.STOPPING
    assert not host.begin_shutdown() and not host.begin_drain(trio.CancelScope())
    assert host.phase is ServerPhase.STOPPING


@pytest.mark.parametrize("phase, stalled, full, ready, health", [
    (ServerPhase.SERVING, False, False, None, "ok"),
    (ServerPhase.SERVING, False, True, "full", "ok"),
    (ServerPhase.SERVING, True, True, "engine_stalled", "stalled"),
    (ServerPhase.DRAINING, True, True, "draining", "draining"),
    (ServerPhase.STOPPING, True, True, "shutting_down", "shutting_down"),
])
def test_one_answer_in_one_order_for_ready_health_and_refusals(phase, stalled, full, ready, health):
    host = make_host(slots=1, queue_size=0)
    host.phase, host.actor.stalled = phase, stalled
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
