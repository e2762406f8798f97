"""Settings as dataclass fields that carry their own help, flag and bounds.

A setting is declared once, with :func:`setting`, in the dataclass of the
layer it belongs to (the engine actor's in ``engine``, the server's in
``server``).  The ``serve`` command line is generated from those fields, and
the same bounds are checked when the dataclass is built in code, so a default,
a limit or a help text exists in exactly one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    low: float | None = None,
    high: float | None = None,
    group: str | None = None,
    cli: bool = True,
    secret: bool = False,
) -> Any:
    """A dataclass field with its command-line ``flag`` (default ``--field-name``), ``help`` and bounds.

    A ``secret`` is left out of the dataclass's ``repr`` (so a logged settings object never shows it).
    """
    return dataclasses.field(
        default=default,
        repr=not secret,
        metadata={"help": help, "flag": flag, "low": low, "high": high, "group": group, "cli": cli},
    )


def flag_of(field: dataclasses.Field[Any]) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def bounds_problem(field: dataclasses.Field[Any], value: Any) -> str | None:
    """What is wrong with ``value`` for ``field`` ("must be at least 1, got 0"), or None."""
    low, high = field.metadata.get("low"), field.metadata.get("high")
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value:  # NaN
        return "must be a number, got nan"
    if low is not None and value < low or high is not None and value > high:
        if high is None:
            return f"must be at least {low:g}, got {value:g}"
        return f"must be between {low:g} and {high:g}, got {value:g}"
    return None


def check_bounds(field: dataclasses.Field[Any], value: Any) -> None:
    """Raise ``ValueError`` naming the flag when ``value`` is outside the field's bounds."""
    problem = bounds_problem(field, value)
    if problem is not None:
        raise ValueError(f"{flag_of(field)} {problem}")


def check_settings(settings: Any) -> None:
    """Check every bounded field of a settings dataclass (call from ``__post_init__``)."""
    for field in dataclasses.fields(settings):
        check_bounds(field, getattr(settings, field.name))
