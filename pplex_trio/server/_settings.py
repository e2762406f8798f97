"""Server settings: one typed object, each default, limit and help text written once.

``ServerSettings`` extends the engine actor's settings; the ``serve`` command
line is generated from its fields (``pplex_trio/_cli/_settings_cli.py``).
Plain units: seconds, bytes, frames, except where the name says ``_ms``.
"""

from __future__ import annotations

import dataclasses
import enum
import pathlib

from .._setting import check_settings, parse_gib, setting
from ..engine import ActorSettings
from ..protocol import parse_origins
from ..protocol._access import AUTH_TOKEN_ENV

MIB = 1024 * 1024


def parse_slots(text: str) -> int | None:
    """``--slots``: a whole number, or ``auto`` (None: sized to the device)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a whole number nor auto") from None


class Framing(enum.StrEnum):
    """``--framing``: how Moshi input is cut into engine frames."""

    ALIGNED = "aligned"  # frames end at the newest audio before each tick (lower latency)
    NAIVE = "naive"  # fixed 1920-sample boundaries


class OpusEncoderPlacement(enum.StrEnum):
    """``--opus-encoder``: where the Opus encoding of ``/api/chat`` output runs."""

    AUTO = "auto"  # process when the system has libopus, else sphn
    PROCESS = "process"  # libopus in a child process (the first --inline-encoders conversations inline)
    INLINE = "inline"  # libopus on the event loop
    SPHN = "sphn"  # sphn on the event loop (holds the GIL: the fallback without libopus)


class VoiceUploads(enum.StrEnum):
    """``--voice-uploads``: whether clients may add (and delete) voices over HTTP."""

    AUTO = "auto"  # on while the server listens on loopback only
    ON = "on"
    OFF = "off"


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclasses.dataclass
class ServerSettings(ActorSettings):
    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0 for all)", group="listening")
    port: int = setting(8998, "port (8998, like the official server; 0 picks a free one)", low=0, high=65535,
                        group="listening")
    model: str = setting(
        "auto", "echo (test engine), tiny (random CPU model), a Hugging Face repo id such as "
        "nvidia/personaplex-7b-v1, or a local checkpoint folder; auto: the real model when torch sees a GPU, "
        "else tiny", group="model")
    slots: int | None = setting(
        None, "concurrent conversations: a number, or auto (the default): on a GPU as many as fit its free memory "
        "once the model is loaded, less --gpu-memory-reserve (`pplex-trio fit` shows the figures); 4 without one",
        low=1, group="model", parse=parse_slots)
    device: str = setting("auto", "torch device: auto, cpu, cuda, cuda:1 …", group="model")
    cuda_graph: bool = setting(
        False, "capture each tick's GPU work as a CUDA graph and replay it (CUDA only; untested on hardware "
        "so far)", group="model")
    voice_dir: pathlib.Path | None = setting(None, "folder of voices: .pt voice prompts and recordings (.wav, .flac, "
                                             ".mp3, .ogg)", group="model")
    gpu_memory_reserve_gib: float = setting(
        2.0, "GPU memory that --slots auto leaves free for CUDA's workspaces and the allocator's slack: "
        "2, 2GiB, 1536MiB", low=0, flag="--gpu-memory-reserve", group="model", parse=parse_gib)
    static_dir: pathlib.Path | None = setting(
        None, "serve another web UI build from this folder (default: the UI shipped with the package)",
        flag="--static", group="listening")
    queue_timeout: float = setting(60.0, "seconds one may wait in the queue for a slot", low=0,
                                   group="conversations")
    max_prompt_chars: int = setting(1000, "persona length limit", low=1, group="conversations")
    max_message_bytes: int = setting(MIB, "larger client messages are refused (close code 1009)", low=1024,
                                     group="conversations")
    opus_encoder: OpusEncoderPlacement = setting(
        OpusEncoderPlacement.AUTO, "where the Opus encoding of /api/chat output runs: process (libopus in a "
        "child process, off the event loop), inline (libopus on the event loop), sphn (sphn on the event "
        "loop), or auto (process when the system has libopus, else sphn)", group="timing")
    inline_encoders: int = setting(
        4, "with the process encoder, this many conversations at a time encode on the event loop instead "
        "(~0.4 ms of it per frame each), which saves them ~2 ms of latency", low=0, group="timing")
    framing: Framing = setting(
        Framing.ALIGNED, "Moshi input framing: aligned (frames end at the newest audio before each tick, "
        "lower latency) or naive (fixed 1920-sample boundaries)", group="timing")
    keepalive_interval: float = setting(2.0, "seconds between pings while a conversation is queued or "
                                        "being prepared", low=0.01, group="conversations")
    client_timeout: float = setting(
        15.0, "a client that reads nothing, or sends nothing (not even a pong to the transport's pings), for "
        "this many seconds is disconnected and its slot freed", low=0.1, group="conversations")
    open_timeout: float = setting(10.0, 'raw protocol: seconds allowed before the {"type": "open"} message',
                                  low=0.01, group="conversations")
    shutdown_grace: float = setting(1.0, "seconds conversations get to close on shutdown", low=0,
                                    group="conversations")
    drain_seconds: float = setting(
        0.0, "on SIGTERM, /ready turns 503 and new conversations are refused, while the live ones may go on "
        "this long before they are closed with 1001 (a second signal ends the drain); 0: close them at once",
        low=0, group="conversations")
    refuse_busy_upgrades: bool = setting(
        False, "answer a conversation's WebSocket upgrade with HTTP 503 and Retry-After, before accepting it, "
        "while the server cannot take it (no slot or queue place free, engine stalled, draining), so that a "
        "load balancer passes it to another replica (deploy/ sets it); off: the client is accepted and then "
        "closed with 1013 or 1001 and a reason a browser can show", group="conversations")
    access_log: bool = setting(
        False, "log one line per request and WebSocket: the client's address, the request (any token= masked), "
        "the status and how long it took", group="listening")
    ssl_dir: pathlib.Path | None = setting(
        None, "serve HTTPS and WSS with DIR/cert.pem and DIR/key.pem, like the official server; when both are "
        "missing, a self-signed pair is made there for localhost, this host's name and its LAN addresses",
        flag="--ssl", group="security")
    certfile: pathlib.Path | None = setting(None, "serve HTTPS and WSS with this certificate (PEM, the chain "
                                            "after it); needs --keyfile", group="security")
    keyfile: pathlib.Path | None = setting(None, "the private key of --certfile (PEM, unencrypted)",
                                           group="security")
    auth_token: str | None = setting(
        None, f"every route but /health and /ready needs this token (a Bearer header, token= in the query, or the cookie "
        f"a page opened with ?token= gets); prefer the {AUTH_TOKEN_ENV} environment variable, which ps does "
        "not show", group="security", secret=True)
    allowed_origins: str = setting(
        "", "web pages at these origins (comma-separated, like https://app.example.com; * for any) may open "
        "WebSockets to the server besides its own pages", group="security")
    max_connections_per_ip: int = setting(
        0, "open WebSocket connections allowed from one address; the next is refused with 429 (0: no limit)",
        low=0, group="security")
    max_session_seconds: float = setting(
        0.0, "a conversation is told why and closed (1000) once it has been live this long (0: no limit)",
        low=0, group="security")
    voice_uploads: VoiceUploads = setting(
        VoiceUploads.AUTO, "whether clients may add voices made from their own clips (POST /api/voices) and delete "
        "them: on, off, or auto (on while the server listens on loopback only); with --auth-token only holders "
        "of the token may", group="voices")
    voice_store: pathlib.Path | None = setting(
        None, "folder that keeps the added voices across restarts (default: one per model under the cache)",
        group="voices")
    echo_delay_frames: int = setting(1, "output delay in 80 ms frames", low=0, group="echo test engine")
    echo_prefill_steps: int = setting(12, "system-prompt positions (run between ticks, instantly)", low=0,
                                      group="echo test engine")
    echo_step_ms: float = setting(0.0, "sleep per step, standing in for GPU time (and a fiftieth of it per "
                                  "system-prompt position)", low=0, group="echo test engine")
    echo_text_share: float = setting(1.0, "the share of frames with a text piece (the frame number); a speaking "
                                     "model gives about 0.3", low=0, high=1, group="echo test engine")
    echo_fail_at_step: int | None = setting(None, "raise an error in this step (counted from 0), for fault tests",
                                            low=0, group="echo test engine")
    echo_hang_at_step: int | None = setting(None, "hang in this step (counted from 0), for fault tests", low=0,
                                            group="echo test engine")
    echo_hang_seconds: float = setting(30.0, "how long that step hangs", low=0, group="echo test engine")

    def __post_init__(self) -> None:
        # Strings are welcome where a choice or a path is expected (tests, callers).
        if isinstance(self.slots, str):
            self.slots = parse_slots(self.slots)
        self.framing = Framing(self.framing)
        self.opus_encoder = OpusEncoderPlacement(self.opus_encoder)
        self.voice_uploads = VoiceUploads(self.voice_uploads)
        for name in ("voice_dir", "voice_store", "static_dir", "ssl_dir", "certfile", "keyfile"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, pathlib.Path(getattr(self, name)))
        check_settings(self)
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("--certfile and --keyfile go together: give both, or --ssl DIR instead")
        if self.certfile is not None and self.ssl_dir is not None:
            raise ValueError("give either --ssl DIR or --certfile/--keyfile, not both")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ValueError(f"--auth-token (or {AUTH_TOKEN_ENV}) is empty; give a long random token, such as "
                             "the output of: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'")
        parse_origins(self.allowed_origins)  # a mistake is said now, not at the first browser

    @property
    def gpu_memory_reserve(self) -> int:
        """``--gpu-memory-reserve`` in bytes."""
        return int(self.gpu_memory_reserve_gib * 2**30)

    @property
    def voice_uploads_allowed(self) -> bool:
        """``--voice-uploads``, with ``auto`` resolved: on for a server that only loopback clients reach."""
        if self.voice_uploads is VoiceUploads.AUTO:
            return self.host in LOOPBACK_HOSTS
        return self.voice_uploads is VoiceUploads.ON

    @property
    def tls(self) -> bool:
        return self.ssl_dir is not None or self.certfile is not None

    @property
    def origins(self) -> frozenset[str]:
        return parse_origins(self.allowed_origins)
