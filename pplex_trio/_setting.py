"""Settings as dataclass fields that carry their own help, flag and bounds.

A setting is declared once, with :func:`setting`, in the dataclass of the
layer it belongs to (the engine actor's in ``engine``, the server's in
``server``).  The ``serve`` command line is generated from those fields, and
the same bounds are checked when the dataclass is built in code, so a default,
a limit or a help text exists in exactly one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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
    parse: Callable[[str], Any] | None = None,
    advanced: bool = False,
    metavar: str | None = None,
    env: str | None = None,
) -> Any:
    """A dataclass field with its command-line ``flag`` (default ``--field-name``), ``help`` and bounds.

    A ``secret`` is left out of the dataclass's ``repr`` (so a logged settings object never shows it).
    ``parse`` turns the flag's text into the value (default: the field's type); it raises ``ValueError``
    with a message for the user. ``env`` names the environment variable that gives the value when the
    command line does not (for secrets: ``ps`` shows flags, not the environment). An ``advanced`` setting (a test
    engine's or a tuning knob) is left out of
    ``--help`` and shown by ``--help-all``; ``metavar`` names the flag's value there (``DIR``, ``SECONDS``).
    """
    return dataclasses.field(
        default=default,
        repr=not secret,
        metadata={
            "help": help,
            "flag": flag,
            "low": low,
            "high": high,
            "group": group,
            "cli": cli,
            "parse": parse,
            "advanced": advanced,
            "metavar": metavar,
            "env": env,
        },
    )


def flag_of(field: dataclasses.Field[Any]) -> str:
    """The field's command-line flag: its ``flag`` metadata, else ``--`` and its name with dashes."""
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


_SIZE_UNITS = {
    "": 2**30,
    "g": 2**30,
    "gib": 2**30,
    "gb": 10**9,
    "m": 2**20,
    "mib": 2**20,
    "mb": 10**6,
    "t": 2**40,
    "tib": 2**40,
    "tb": 10**12,
}


def parse_gib(text: str) -> float:
    """A memory size in GiB from ``24``, ``24GiB``, ``80GB`` (10**9 bytes), ``1536MiB``, ``0.5TiB``."""
    cleaned = text.strip().lower().replace(" ", "")
    number = cleaned.rstrip("abgimt")
    unit = cleaned[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = None
    if value is None or unit not in _SIZE_UNITS or not value >= 0:
        raise ValueError(f"{text!r} is not a memory size (such as 24GiB, 80GB or 1536MiB)")
    return value * _SIZE_UNITS[unit] / 2**30
