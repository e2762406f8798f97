"""``pplex-trio serve`` with a random-weight model of a named config: bench/gpu/run's server step.

Takes a config name, then ``serve`` flags::

    python bench/gpu/_server.py personaplex-7b-v1 --device cuda --cuda-graph --slots 64 --port 0

The model has the config's real shapes and four voices of 4 s (``random_model``), so a conversation's
system prompt (voice, persona) and every tick cost what they cost with the real weights.
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

import trio

from pplex_trio._cli import build_parser, log_level
from pplex_trio._cli._engines import resolve_device
from pplex_trio._cli._settings_cli import settings_from_args
from pplex_trio.engine._fit import auto_slots
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import CONFIGS, random_model
from pplex_trio.server import ServerSettings, serve


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CONFIGS:
        logging.error("usage: _server.py {%s} [serve flags]", ",".join(CONFIGS))
        return 2
    args = build_parser().parse_args(["serve", *argv[1:]])
    logging.basicConfig(level=log_level(args), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(ServerSettings, args)
    model = random_model(CONFIGS[argv[0]], resolve_device(settings.device), voice_dir=Path(tempfile.mkdtemp()))
    slots = settings.slots or auto_slots(model, settings.gpu_memory_reserve)
    engine = PersonaPlexEngine(model, slots, cuda_graph=settings.cuda_graph.engine_argument)
    trio.run(lambda: serve(settings, engine, handle_signals=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
