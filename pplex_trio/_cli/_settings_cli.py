"""The ``serve`` command line, generated from the settings dataclass.

Each field declared with :func:`pplex_trio._setting.setting` becomes one
flag: its name (or its ``flag``), its type (numbers, text, paths, choices from
an enum, on/off for a bool), its default and help, grouped as the field says.
So a new setting needs one line in its dataclass and nothing here.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from typing import Any

from .._setting import bounds_problem, flag_of


def add_settings_arguments(parser: argparse.ArgumentParser, settings_class: type) -> None:
    """One flag per command-line field of ``settings_class``, in argument groups."""
    hints = typing.get_type_hints(settings_class)
    groups: dict[str | None, Any] = {None: parser}
    for field in dataclasses.fields(settings_class):
        if not field.metadata.get("cli", False):
            continue
        group_name = field.metadata.get("group")
        if group_name not in groups:
            groups[group_name] = parser.add_argument_group(group_name)
        target = groups[group_name]
        kind = _plain_type(hints[field.name])
        default = field.default
        help_text = field.metadata["help"]
        if kind is bool:
            target.add_argument(flag_of(field), dest=field.name, action=argparse.BooleanOptionalAction,
                                default=default, help=help_text)
            continue
        if default is not None:
            shown = default.value if isinstance(default, enum.Enum) else default
            help_text = f"{help_text} (default {shown})"
        options: dict[str, Any] = {"dest": field.name, "default": default, "help": help_text,
                                   "type": _parser_for(field, kind)}
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            options["choices"] = list(kind)
            options["metavar"] = "{" + ",".join(member.value for member in kind) + "}"
        target.add_argument(flag_of(field), **options)


def settings_from_args(settings_class: type, args: argparse.Namespace) -> Any:
    """Build ``settings_class`` from the parsed flags (fields without a flag keep their default)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(settings_class) if hasattr(args, f.name)}
    return settings_class(**values)


def _plain_type(hint: Any) -> Any:
    """``Path | None`` → ``Path``: the type a flag's text becomes."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (kind,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return kind
    return hint


def _parser_for(field: dataclasses.Field[Any], kind: Any) -> Callable[[str], Any]:
    own = field.metadata.get("parse")

    def parse(text: str) -> Any:
        try:
            value = own(text) if own is not None else kind(text)
        except ValueError as exc:
            if own is not None:
                raise argparse.ArgumentTypeError(str(exc)) from None
            if isinstance(kind, type) and issubclass(kind, enum.Enum):
                what = "one of " + ", ".join(member.value for member in kind)
            else:
                what = {int: "a whole number", float: "a number"}.get(kind, "a valid value")
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        problem = bounds_problem(field, value)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__ if isinstance(kind, type) else "value"
    return parse

