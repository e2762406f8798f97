"""``pplex-trio serve`` with the worker-thread Opus encoders, for comparison benchmarks only.

The server itself encodes in a child process or on the event loop; the
worker-thread placement (``_thread_encoders.py``) lost to them and is kept
here so that ``bench/load.py --opus-encoder thread-libopus`` (or
``thread-sphn``) can measure it again.  Takes the ``serve`` flags, e.g.::

    python bench/thread_encoder_server.py libopus --model echo --slots 32 --port 0
"""

from __future__ import annotations

import logging
import sys

import trio
from _thread_encoders import ThreadEncoders

from pplex_trio._cli import build_parser, log_level
from pplex_trio._cli._engines import create_engine
from pplex_trio._cli._settings_cli import settings_from_args
from pplex_trio.server import ServerSettings, serve
from pplex_trio.server import _context as server_context


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("libopus", "sphn"):
        logging.error("usage: thread_encoder_server.py {libopus,sphn} [serve flags]")
        return 2
    kind, flags = argv[0], argv[1:]
    args = build_parser().parse_args(["serve", *flags])
    logging.basicConfig(level=log_level(args), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(ServerSettings, args)
    engine = create_engine(settings)
    # The one difference from `pplex-trio serve`: the server's context makes these encoders, whatever
    # --opus-encoder says (a benchmark's substitution, not an option the server offers).
    server_context.make_encoders = lambda placement, inline_streams=0: ThreadEncoders(kind)
    trio.run(lambda: serve(settings, engine, handle_signals=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
