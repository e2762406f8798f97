"""``pplex-trio``: serve, client, offline, fit, voice, quantize, compare (the top layer: it may import every other)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pathlib
import sys
import textwrap
import typing
from collections.abc import Sequence

import trio

from .._version import __version__
from ..client import RECONNECT_SECONDS
from ._fit import add_arguments as add_fit_arguments
from ._offline import add_arguments as add_offline_arguments
from ._quantize import add_compare_arguments, add_quantize_arguments, run_compare, run_quantize
from ._reach import add_reach_arguments, reach
from ._settings_cli import add_settings_arguments, config_reader, settings_from_args
from ._voice import add_arguments as add_voice_arguments

logger = logging.getLogger("pplex_trio")


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's, but lines are not broken inside a flag (``--no-`` / ``cuda-graph``)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line: with ~40 flags, the usage would bury it."""

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SERVE_DESCRIPTION = (
    "Run the speech server. Any option can come from a TOML file instead (--config), its key the "
    "option without the dashes; the command line wins."
)


def build_parser() -> argparse.ArgumentParser:
    """The ``pplex-trio`` argument parser with every subcommand."""
    parser = _Parser(prog="pplex-trio", description="Real-time full-duplex PersonaPlex speech server")
    parser.add_argument("--version", action="version", version=f"pplex-trio {__version__}")
    _add_log_level(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve", help="run the server", usage="%(prog)s [options]", description=SERVE_DESCRIPTION
    )
    _add_serve_arguments(serve)

    client = commands.add_parser("client", help="stream a wav file through a running server")
    client.add_argument("url", help="server URL, e.g. http://127.0.0.1:8998")
    client.add_argument("--input", required=True, type=pathlib.Path, help="wav file to send")
    client.add_argument("--output", required=True, type=pathlib.Path, help="wav file for the agent's audio")
    client.add_argument("--text", type=pathlib.Path, help="JSON file for the agent's text pieces")
    client.add_argument("--persona", help="persona (text prompt)")
    client.add_argument("--voice", help="voice prompt name, e.g. NATF2.pt")
    client.add_argument(
        "--protocol",
        choices=("moshi", "raw", "realtime"),
        default="moshi",
        help="wire protocol: moshi (/api/chat), raw (/v1/audio/duplex) or realtime (/v1/realtime; default moshi)",
    )
    client.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=30.0,
        help="give up on a call once the server has sent nothing for this many seconds (default 30)",
    )
    client.add_argument(
        "--reconnect-seconds",
        type=_seconds,
        default=RECONNECT_SECONDS,
        help="when the connection drops mid-call, reconnect with backoff for this many seconds and resume the "
        "call (the input that fell in the outage is not sent, and the answer has silence there; realtime has no "
        "hang-up, so the server then holds the call's slot for its window after the end); 0: never (default 20, "
        "the server's --resume-seconds)",
    )
    add_reach_arguments(client)

    offline = commands.add_parser("offline", help="run a model over a wav file without a server")
    add_offline_arguments(offline)

    fit = commands.add_parser("fit", help="how many conversations of a model fit a GPU's memory")
    add_fit_arguments(fit)

    voice = commands.add_parser(
        "voice", help="make a voice from a clip (create), or add, remove and list a running server's voices"
    )
    add_voice_arguments(voice)

    quantize = commands.add_parser("quantize", help="write a model with its LM in int8 (serve it with --model DIR)")
    add_quantize_arguments(quantize)
    compare = commands.add_parser(
        "compare", help="what --quantize / --kv-cache change in a conversation, against full precision"
    )
    add_compare_arguments(compare)
    for command in (client, offline, fit, voice, quantize, compare):
        _add_log_level(command)  # before or after the sub-command
    return parser


def _add_serve_arguments(serve: argparse.ArgumentParser, *, show_advanced: bool = False) -> None:
    from ..server import ServerSettings

    serve.add_argument("--help-all", action=_HelpAll, help="show every option, those for tests and tuning too")
    serve.add_argument(
        "--config",
        metavar="FILE",
        type=config_reader(ServerSettings, {"log-level": _toml_level}),
        help="read settings from this TOML file (deploy/serve.example.toml shows one)",
    )
    groups = add_settings_arguments(serve, ServerSettings, show_advanced=show_advanced)
    _add_log_level(groups["observability"])


class _HelpAll(argparse.Action):
    """``serve --help-all``: the help with the advanced settings (test engine, tuning) shown as well."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: typing.Any,
        option_string: str | None = None,
    ) -> None:
        full = _Parser(prog=parser.prog, usage=parser.usage, description=parser.description)
        _add_serve_arguments(full, show_advanced=True)
        full.print_help()
        parser.exit()


def _add_log_level(target: typing.Any) -> None:
    # SUPPRESS: a level given before the sub-command is not overwritten by the sub-command's default.
    target.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help="DEBUG, INFO, WARNING or ERROR (default INFO)",
    )


def _toml_level(value: object) -> str:
    """``log-level`` in a ``--config`` file."""
    if not isinstance(value, str) or value.upper() not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.upper()


def log_level(args: argparse.Namespace) -> str:
    """The command line's ``--log-level``, else the ``--config`` file's, else INFO."""
    return getattr(args, "log_level", None) or (getattr(args, "config", None) or {}).get("log_level") or "INFO"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``pplex-trio`` entry point: parse ``argv``, set up logging, run the subcommand; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=log_level(args), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if args.command == "serve":
        try:
            return _serve(args)
        except KeyboardInterrupt:  # Ctrl-C while a model loads (minutes for the real one)
            return _interrupted()
    if args.command == "client":
        return _client(args)
    if args.command == "offline":
        from ._offline import run

        return run(args)
    if args.command == "fit":
        from ._fit import run as run_fit

        return run_fit(args)
    if args.command == "voice":
        from ._voice import run as run_voice

        return run_voice(args)
    if args.command == "quantize":
        return run_quantize(args)
    if args.command == "compare":
        return run_compare(args)
    raise AssertionError(args.command)


def _serve(args: argparse.Namespace) -> int:
    from ..server import (
        ListenError,
        ServerSettings,
        bind_sockets,
        prepare_record_folder,
        serve,
        socket_listeners,
        tls_certificate,
    )
    from ._engines import ModelUnavailable, create_engine

    for field in dataclasses.fields(ServerSettings):
        env = field.metadata.get("env")
        if env and not hasattr(args, field.name) and env in os.environ:
            # The recommended way for a secret (ps shows flags, not the environment); it wins over a --config file's.
            setattr(args, field.name, os.environ[env])
    try:
        settings = settings_from_args(ServerSettings, args)
    except ValueError as exc:
        logger.error("%s", exc)
        return 2
    if settings.static_dir is not None and not (settings.static_dir / "index.html").is_file():
        logger.error("--static %s has no index.html", settings.static_dir)
        return 2
    sockets = []
    try:
        certificate = tls_certificate(settings)
        if settings.record_dir is not None:
            prepare_record_folder(settings.record_dir)  # (a folder it cannot write is said before a model loads)
        sockets = bind_sockets(settings)  # first: a port in use is said at once, not after loading a model
        engine = create_engine(settings)
    except (ListenError, ModelUnavailable, FileNotFoundError, ValueError) as exc:
        logger.error("%s", exc)
        for sock in sockets:
            sock.close()
        return 2
    listeners = socket_listeners(sockets)
    trio.run(lambda: serve(settings, engine, handle_signals=True, listeners=listeners, certificate=certificate))
    logger.info("server stopped")
    return 0


def _interrupted() -> int:
    logger.info("interrupted before the server started")
    return 130


def _client(args: argparse.Namespace) -> int:
    return trio.run(client_main, args)


async def client_main(args: argparse.Namespace) -> int:
    """``pplex-trio client``: 0 for a complete answer; 1, and one line saying what happened (and what was written
    of the answer), for a call refused or cut short; 2 for a --cafile that cannot be read."""
    from ..client import ClientError, Refused, run_client

    reached = reach(args)
    if reached is None:
        return 2
    token, context = reached
    try:
        await run_client(
            args.url,
            args.input,
            args.output,
            text_json=args.text,
            protocol=args.protocol,
            persona=args.persona,
            voice=args.voice,
            token=token,
            ssl_context=context,
            idle_timeout=args.timeout,
            reconnect_seconds=args.reconnect_seconds,
        )
    except (ClientError, Refused, OSError) as exc:  # (OSError: the input file)
        logger.error("%s", exc)
        return 1
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value
