"""``pplex-trio``: serve, client, offline."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
from collections.abc import Sequence

import trio

from ._version import __version__

logger = logging.getLogger("pplex_trio")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _grace_ms(text: str) -> float:
    try:
        value = _non_negative_float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    if value > 40:
        raise argparse.ArgumentTypeError(f"{text} ms is too long for an 80 ms tick; use 0 to 40 (0 turns it off)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pplex-trio", description="Real-time full-duplex PersonaPlex speech server")
    parser.add_argument("--version", action="version", version=f"pplex-trio {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all; default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8998, help="port (default 8998, like the official server)")
    serve.add_argument(
        "--model", default="echo",
        help="echo (test engine), tiny (random CPU model), a Hugging Face repo id such as "
        "nvidia/personaplex-7b-v1, or a local checkpoint directory (default echo)")
    serve.add_argument("--slots", type=_positive_int, default=4, help="concurrent conversations (default 4)")
    serve.add_argument("--device", default="auto", help="torch device: auto, cpu, cuda, cuda:1 … (default auto)")
    serve.add_argument(
        "--cuda-graph", action="store_true",
        help="capture each tick's GPU work as a CUDA graph and replay it (CUDA only; untested on hardware so far)")
    serve.add_argument("--voice-dir", type=pathlib.Path, help="folder of voice prompt .pt files")
    serve.add_argument("--static", dest="static_dir", type=pathlib.Path, help="serve another web UI build from this folder")
    serve.add_argument("--queue-size", type=_non_negative_int, default=16, help="connections that may wait for a slot (default 16)")
    serve.add_argument("--queue-timeout", type=_non_negative_float, default=60.0, help="seconds one may wait (default 60)")
    serve.add_argument("--max-prompt-chars", type=_positive_int, default=1000, help="persona length limit (default 1000)")
    serve.add_argument(
        "--opus-encoder", choices=("auto", "process", "libopus", "sphn"), default="auto",
        help="Opus encoding of /api/chat output: process (libopus in a child process, off the event loop's GIL), "
        "libopus (in a worker thread), sphn (in a worker thread), or auto (process when the system has "
        "libopus, else sphn); default auto")
    serve.add_argument(
        "--inline-encoders", type=_non_negative_int, default=4,
        help="with the process encoder, this many conversations at a time encode on the event loop instead "
        "(~0.4 ms of it per frame each), which saves them ~2 ms of latency; default 4")
    serve.add_argument(
        "--framing", choices=("aligned", "naive"), default="aligned",
        help="Moshi input framing: aligned (frames end at the newest audio before each tick, lower latency) "
        "or naive (fixed 1920-sample boundaries); default aligned")
    serve.add_argument(
        "--input-grace-ms", type=_grace_ms, default=4.0,
        help="with aligned framing, a tick may wait this long for a conversation's page that is due, rather "
        "than feed it a silent frame and a tick of delay (at most 3 ticks in 2 s); 0 turns it off; default 4")
    echo = serve.add_argument_group("echo test engine")
    echo.add_argument("--echo-delay-frames", type=_non_negative_int, default=1, help="output delay in 80 ms frames (default 1)")
    echo.add_argument("--echo-prefill-steps", type=_non_negative_int, default=12, help="system-prompt ticks (default 12)")
    echo.add_argument("--echo-step-ms", type=_non_negative_float, default=0.0, help="sleep per step, standing in for GPU time")

    client = commands.add_parser("client", help="stream a wav file through a running server")
    client.add_argument("url", help="server URL, e.g. http://127.0.0.1:8998")
    client.add_argument("--input", required=True, type=pathlib.Path, help="wav file to send")
    client.add_argument("--output", required=True, type=pathlib.Path, help="wav file for the agent's audio")
    client.add_argument("--text", type=pathlib.Path, help="JSON file for the agent's text pieces")
    client.add_argument("--persona", help="persona (text prompt)")
    client.add_argument("--voice", help="voice prompt name, e.g. NATF2.pt")
    client.add_argument("--protocol", choices=("moshi", "raw"), default="moshi", help="wire protocol (default moshi)")

    offline = commands.add_parser("offline", help="run a model over a wav file without a server")
    try:
        from .model._offline import add_arguments
    except ImportError:
        offline.set_defaults(unavailable=True)
    else:
        add_arguments(offline)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    if args.command == "serve":
        return _serve(args)
    if args.command == "client":
        return _client(args)
    if args.command == "offline":
        if getattr(args, "unavailable", False):
            logger.error("offline inference is not available in this build")
            return 2
        from .model._offline import run

        return run(args)
    raise AssertionError(args.command)


def _serve(args: argparse.Namespace) -> int:
    from ._engines import ModelUnavailable, create_engine
    from .server import ServerSettings, serve

    settings = ServerSettings(
        host=args.host, port=args.port, model=args.model, slots=args.slots, device=args.device,
        cuda_graph=args.cuda_graph,
        voice_dir=args.voice_dir, static_dir=args.static_dir, queue_size=args.queue_size,
        queue_timeout=args.queue_timeout, max_prompt_chars=args.max_prompt_chars, framing=args.framing,
        opus_encoder=args.opus_encoder, inline_encoders=args.inline_encoders,
        input_grace=args.input_grace_ms / 1000.0,
        echo_delay_frames=args.echo_delay_frames, echo_prefill_steps=args.echo_prefill_steps,
        echo_step_seconds=args.echo_step_ms / 1000.0,
    )
    if settings.static_dir is not None and not (settings.static_dir / "index.html").is_file():
        logger.error("--static %s has no index.html", settings.static_dir)
        return 2
    try:
        engine = create_engine(settings)
    except (ModelUnavailable, FileNotFoundError, ValueError) as exc:
        logger.error("%s", exc)
        return 2
    trio.run(lambda: serve(settings, engine, handle_signals=True))
    logger.info("server stopped")
    return 0


def _client(args: argparse.Namespace) -> int:
    from .client import ClientError, run_client

    try:
        trio.run(
            lambda: run_client(
                args.url, args.input, args.output, text_json=args.text, protocol=args.protocol,
                persona=args.persona, voice=args.voice,
            )
        )
    except (ClientError, OSError, BaseExceptionGroup) as exc:
        for leaf in _leaves(exc):
            if not isinstance(leaf, (ClientError, OSError)):
                raise
            logger.error("%s%s", "server: " if isinstance(leaf, ClientError) else "", leaf)
        return 1
    return 0


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups that trio raises."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
