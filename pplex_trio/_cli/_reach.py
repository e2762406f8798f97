"""How the commands that talk to a running server (``client``, ``voice``) reach it: its token and TLS."""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import ssl

logger = logging.getLogger(__name__)


def add_reach_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every subcommand that talks to a running server takes: ``--token``, ``--cafile``,
    ``--insecure``."""
    parser.add_argument(
        "--token",
        help="the server's access token (default: the PPLEX_TRIO_AUTH_TOKEN environment "
        "variable, which ps does not show)",
    )
    parser.add_argument(
        "--cafile",
        type=pathlib.Path,
        help="with https://, trust the certificates in this PEM file (such as the cert.pem a server made with --ssl)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="with https://, do not check the server's certificate (a self-signed one you have not copied here)",
    )


def reach(args: argparse.Namespace) -> tuple[str | None, ssl.SSLContext | None] | None:
    """The token and TLS context the arguments ask for; None (and a log line) for a --cafile that cannot be
    read."""
    from ..client import client_ssl_context
    from ..protocol import AUTH_TOKEN_ENV

    token: str | None = args.token if args.token is not None else os.environ.get(AUTH_TOKEN_ENV)
    try:
        return token, client_ssl_context(insecure=args.insecure, cafile=args.cafile)
    except (OSError, ssl.SSLError) as exc:
        logger.error("--cafile %s: %s", args.cafile, exc)
        return None
