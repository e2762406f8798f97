"""Each lifecycle's drawing in docs/ARCHITECTURE.md is its table of moves, state for state.

The drawings are Mermaid state diagrams made from the tables below (the
start, then every move in the enum's order); a table that changes makes this
test fail with the drawing to paste.
"""

from __future__ import annotations

import pathlib

import pytest

from pplex_trio._lifecycle import IllegalTransition, Lifecycle
from pplex_trio.engine import ACTOR_LIFECYCLE, LEASE_LIFECYCLE, ActorState
from pplex_trio.server._server_state import SERVER_LIFECYCLE
from pplex_trio.server.sessions._session import SESSION_LIFECYCLE

ARCHITECTURE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md"
LIFECYCLES = {
    "SERVER_LIFECYCLE": SERVER_LIFECYCLE,
    "SESSION_LIFECYCLE": SESSION_LIFECYCLE,
    "LEASE_LIFECYCLE": LEASE_LIFECYCLE,
    "ACTOR_LIFECYCLE": ACTOR_LIFECYCLE,
}


def drawing(lifecycle: Lifecycle) -> str:
    order = list(type(lifecycle.start))
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {lifecycle.start.name}"]
    for state in order:
        for target in sorted(lifecycle.moves[state], key=order.index):
            lines.append(f"    {state.name} --> {target.name}")
    lines.append("```")
    return "\n".join(lines)


@pytest.mark.parametrize("name", LIFECYCLES)
def test_the_architecture_draws_each_lifecycle_from_its_table(name):
    marker = f"<!-- {name}: drawn from its table; tests/test_lifecycles.py keeps it so -->"
    text = ARCHITECTURE.read_text()
    assert marker in text, f"docs/ARCHITECTURE.md has no drawing of {name} (marker: {marker})"
    drawn = text.split(marker, 1)[1].lstrip("\n")
    expected = drawing(LIFECYCLES[name])
    assert drawn.startswith(expected), (
        f"docs/ARCHITECTURE.md's {name} differs from its table; draw it so:\n{marker}\n{expected}"
    )


def test_every_state_of_a_lifecycle_has_a_row_and_every_move_stays_inside_it():
    for lifecycle in LIFECYCLES.values():
        states = set(type(lifecycle.start))
        assert set(lifecycle.moves) == states, lifecycle.name
        assert all(targets <= states for targets in lifecycle.moves.values()), lifecycle.name


def test_the_actor_makes_one_call_at_a_time_and_refuses_conversations_from_a_stall_until_the_engine_is_back():
    """(The moves themselves, made by a running actor: ``tests/engine/test_actor.py``.)"""
    A = ActorState
    allowed = {
        (A.IDLE, A.CALLING),
        (A.CALLING, A.IDLE),
        (A.CALLING, A.RESETTING),
        (A.CALLING, A.STALLED),
        (A.RESETTING, A.IDLE),
        (A.STALLED, A.RECOVERING),
        (A.RECOVERING, A.IDLE),
    }
    for a in A:
        for b in A:
            assert ACTOR_LIFECYCLE.allows(a, b) == ((a, b) in allowed), (a, b)
    with pytest.raises(IllegalTransition, match="stalled to idle"):
        ACTOR_LIFECYCLE.move(A.STALLED, A.IDLE)  # a stalled call is waited for, and the engine reset after it
    assert {state for state in A if state.refuses} == {A.STALLED, A.RECOVERING}
