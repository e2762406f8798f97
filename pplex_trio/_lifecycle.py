"""Lifecycles, one idiom for all: an enum, its moves in one table, and one error for a move it does not have.

A server, a session and a lease each keep their state in an enum and change it
only through :meth:`Lifecycle.move`, which refuses a move the table does not
have with :class:`IllegalTransition` (a bug in the caller, never a client's
doing).  ``docs/ARCHITECTURE.md`` draws each table; a test keeps the drawings
equal to the tables.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from typing import Generic, TypeVar

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(RuntimeError):
    """A move its lifecycle does not have."""


class Lifecycle(Generic[S]):
    """The moves of one lifecycle: it begins at ``start``; ``moves[state]`` is every state ``state`` may go to."""

    def __init__(self, name: str, start: S, moves: Mapping[S, Collection[S]]):
        self.name = name
        self.start = start
        self.moves: dict[S, frozenset[S]] = {state: frozenset(targets) for state, targets in moves.items()}

    def allows(self, current: S, target: S) -> bool:
        """Whether ``current`` may move to ``target`` (a query: nothing changes)."""
        return target in self.moves[current]

    def move(self, current: S, target: S) -> S:
        """``target``, when ``current`` may go there; else :class:`IllegalTransition`."""
        if target not in self.moves[current]:
            raise IllegalTransition(f"{self.name}: no transition from {current.value} to {target.value}")
        return target
