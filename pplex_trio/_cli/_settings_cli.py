"""The ``serve`` command line and its ``--config`` file, generated from the settings dataclass.

Each field declared with :func:`pplex_trio._setting.setting` becomes one
flag: its name (or its ``flag``), its type (numbers, text, paths, choices from
an enum, on/off for a bool), its default and help, grouped as the field says;
a field marked ``advanced`` is shown by ``--help-all`` only.  The same field
is a key of the TOML file: the flag without its leading dashes
(``slots = 8``, ``client-timeout = 20``, ``ssl = "/etc/pplex-trio/tls"``).
So a new setting needs one line in its dataclass and nothing here.

Precedence: the command line, then the file, then the dataclass default (the
flags' argparse default is SUPPRESS, so a flag not given leaves no value).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import json
import pathlib
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._setting import bounds_problem, flag_of

# TOML keys that are not settings fields (such as log-level) and how their values are checked.
ExtraKeys = Mapping[str, Callable[[Any], Any]]


def add_settings_arguments(
    parser: argparse.ArgumentParser, settings_class: type, *, show_advanced: bool = False
) -> dict[str, Any]:
    """One flag per command-line field of ``settings_class``, in argument groups; returns the groups by title.

    Groups come in the order of ``settings_class.help_groups``; an advanced field's help is suppressed
    unless ``show_advanced`` (then argparse leaves out a group with nothing to show).
    """
    hints = typing.get_type_hints(settings_class)
    groups: dict[str, Any] = {
        title: parser.add_argument_group(title) for title in getattr(settings_class, "help_groups", ())
    }
    for field in cli_fields(settings_class):
        title = field.metadata.get("group") or "other settings"
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        kind = _plain_type(hints[field.name])
        shown = show_advanced or not is_advanced(field)
        help_text = _help_with_default(field, kind) if shown else argparse.SUPPRESS
        if kind is bool:
            groups[title].add_argument(
                flag_of(field),
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        if _switch(kind):  # --flag alone is on, --no-flag off, --flag VALUE any of its choices
            groups[title].add_argument(
                flag_of(field),
                dest=field.name,
                default=argparse.SUPPRESS,
                help=help_text,
                nargs="?",
                const=kind("on"),
                type=_flag_parser(field, kind),
                metavar=_metavar(field, kind),
            )
            groups[title].add_argument(
                "--no-" + flag_of(field).removeprefix("--"),
                dest=field.name,
                action="store_const",
                const=kind("off"),
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
            continue
        groups[title].add_argument(
            flag_of(field),
            dest=field.name,
            default=argparse.SUPPRESS,
            help=help_text,
            type=_flag_parser(field, kind),
            metavar=_metavar(field, kind),
        )
    return groups


def settings_from_args(settings_class: type, args: argparse.Namespace) -> Any:
    """Build ``settings_class`` from the ``--config`` file's values and the flags given over them."""
    names = {field.name for field in dataclasses.fields(settings_class)}
    values = {name: value for name, value in (getattr(args, "config", None) or {}).items() if name in names}
    values.update({name: getattr(args, name) for name in names if hasattr(args, name)})
    return settings_class(**values)


def cli_fields(settings_class: type) -> Iterator[dataclasses.Field[Any]]:
    """The fields of ``settings_class`` that are command-line flags (``cli`` in their metadata)."""
    return (field for field in dataclasses.fields(settings_class) if field.metadata.get("cli", False))


def is_advanced(field: dataclasses.Field[Any]) -> bool:
    """Whether ``field`` is an advanced flag (``advanced`` in its metadata), shown by ``--help-all`` only."""
    return bool(field.metadata.get("advanced", False))


def toml_key(field: dataclasses.Field[Any]) -> str:
    """A setting's key in the ``--config`` file: its flag without the dashes."""
    return flag_of(field).removeprefix("--")


def config_reader(settings_class: type, extra: ExtraKeys | None = None) -> Callable[[str], dict[str, Any]]:
    """The ``type`` of ``--config FILE``: the file read and checked, or an argparse error that says why."""

    def read(text: str) -> dict[str, Any]:
        try:
            return load_config(pathlib.Path(text), settings_class, extra or {})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = "config file"
    return read


def load_config(path: pathlib.Path, settings_class: type, extra: ExtraKeys | None = None) -> dict[str, Any]:
    """The settings in a TOML file, by field name (``extra`` keys by their name with underscores).

    Raises ``ValueError`` naming the file and the key: an unknown key (with the closest known one),
    a value of the wrong type or out of bounds.
    """
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    extra = extra or {}
    hints = typing.get_type_hints(settings_class)
    fields = {toml_key(field): field for field in cli_fields(settings_class)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields and key not in extra:
            close = difflib.get_close_matches(key.replace("_", "-"), [*fields, *extra], n=1)
            hint = f"did you mean {close[0]!r}?" if close else "the keys are the flags without their dashes"
            raise ValueError(f"{path}: unknown key {key!r} ({hint})")
        try:
            if key in extra:
                values[key.replace("-", "_")] = extra[key](value)
            else:
                field = fields[key]
                values[field.name] = _from_toml(field, _plain_type(hints[field.name]), value)
        except ValueError as exc:
            raise ValueError(f"{path}: {key}: {exc}") from None
    return values


def _from_toml(field: dataclasses.Field[Any], kind: Any, value: Any) -> Any:
    """A TOML value as the field's type, checked as the flag is; ``ValueError`` in words otherwise."""
    own = field.metadata.get("parse")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_shown_toml(value)}")
    elif _switch(kind) and isinstance(value, bool):
        value = kind("on" if value else "off")
    elif own is not None and (number or isinstance(value, str)):
        value = own(str(value))  # its own words for a mistake (slots = "many")
    elif kind in (int, float):
        if not number or kind is int and not isinstance(value, int):
            raise ValueError(f"expected {_what(kind)}, got {_shown_toml(value)}")
        value = kind(value)
    elif not isinstance(value, str):
        raise ValueError(f"expected {_what(kind)} in quotes, got {_shown_toml(value)}")
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        if value not in {member.value for member in kind}:
            raise ValueError(f"expected {_what(kind)}, got {_shown_toml(value)}")
        value = kind(value)
    elif kind is not str:
        value = kind(value)  # a path
    problem = bounds_problem(field, value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _shown_toml(value: Any) -> str:
    """A value as TOML writes it (true, "text", [1, 2]), for error messages."""
    return json.dumps(value, default=str)


def _what(kind: Any) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "one of " + ", ".join(member.value for member in kind)
    return {int: "a whole number", float: "a number", str: "text"}.get(kind, "a path")


def _switch(kind: Any) -> bool:
    """A choice with ``on`` and ``off`` among its values (and others, such as ``auto``)."""
    return isinstance(kind, type) and issubclass(kind, enum.Enum) and {"on", "off"} <= {m.value for m in kind}


def _plain_type(hint: Any) -> Any:
    """``Path | None`` → ``Path``: the type a flag's text becomes."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (kind,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return kind
    return hint


def _metavar(field: dataclasses.Field[Any], kind: Any) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "{" + ",".join(member.value for member in kind) + "}"
    return field.metadata.get("metavar") or {int: "N", float: "N"}.get(kind, "VALUE")


def _help_with_default(field: dataclasses.Field[Any], kind: Any) -> str:
    """The help, and the default as a value one could type (none for an unset path or an empty list)."""
    default = field.default
    if kind is bool:
        shown = flag_of(field) if default else "--no-" + flag_of(field).removeprefix("--")
    elif isinstance(default, enum.Enum):
        shown = default.value
    elif isinstance(default, float):
        shown = f"{default:g}"
    else:
        shown = "" if default is None else str(default)
    text = field.metadata["help"] + (f" (default {shown})" if shown else "")
    return text.replace("%", "%%")  # argparse formats help with %


def _flag_parser(field: dataclasses.Field[Any], kind: Any) -> Callable[[str], Any]:
    own = field.metadata.get("parse")

    def parse(text: str) -> Any:
        try:
            value = own(text) if own is not None else kind(text)
        except ValueError as exc:
            if own is not None:
                raise argparse.ArgumentTypeError(str(exc)) from None
            raise argparse.ArgumentTypeError(f"{text!r} is not {_what(kind)}") from None
        problem = bounds_problem(field, value)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__ if isinstance(kind, type) else "value"
    return parse
