"""Server settings: one typed object, each default, limit and help text written once.

``ServerSettings`` extends the engine actor's settings; the ``serve`` command
line and the keys of its ``--config`` file are generated from its fields
(``pplex_trio/_cli/_settings_cli.py``).
Plain units: seconds, bytes, frames, except where the name says ``_ms``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import ClassVar

from .._precision import KVFormat, WeightFormat
from .._setting import check_settings, parse_gib, setting
from ..protocol import AUTH_TOKEN_ENV, client_secrets, parse_origins, telnyx
from ._listening_settings import ListeningSettings
from ._setting_types import (
    LOOPBACK_HOSTS,
    CudaGraphMode,
    Framing,
    OpusEncoderPlacement,
    VoiceUploads,
    parse_slots,
)

MIB = 1024 * 1024
TWILIO_AUTH_TOKEN_ENV = "PPLEX_TRIO_TWILIO_AUTH_TOKEN"
TELNYX_PUBLIC_KEY_ENV = "PPLEX_TRIO_TELNYX_PUBLIC_KEY"
PLIVO_AUTH_TOKEN_ENV = "PPLEX_TRIO_PLIVO_AUTH_TOKEN"


@dataclasses.dataclass
class ServerSettings(ListeningSettings):
    """Every setting of a server (the engine actor's included), checked on creation (``ValueError`` saying which flag to
    fix); ``serve``'s flags and ``--config`` keys are generated from the fields.
    """

    # How ``serve --help`` presents the settings: its groups in this order (the advanced ones: --help-all).
    help_groups: ClassVar[tuple[str, ...]] = (
        "listening",
        "model and GPU",
        "conversations",
        "voices",
        "security",
        "observability",
        "timing",
    )

    static_dir: pathlib.Path | None = setting(
        None,
        "serve another web UI build from this folder instead of the one shipped",
        flag="--static",
        group="listening",
        advanced=True,
        metavar="DIR",
    )
    model: str = setting(
        "auto",
        "echo or echo:delay=1,prompt=12,step_ms=0,text_share=1 (the test engine), tiny (random CPU "
        "model), a Hugging Face repo id, a checkpoint folder, or auto: the real model when torch sees a GPU, "
        "else tiny",
        group="model and GPU",
        metavar="NAME",
    )
    device: str = setting("auto", "torch device: auto, cpu, cuda, cuda:1 …", group="model and GPU", metavar="DEVICE")
    transcribe: str = setting(
        "auto",
        "caller's words: off, tiny, a Kyutai STT repo/folder, or auto (the 1B one on a GPU)",
        group="model and GPU",
        metavar="MODEL",
    )
    turn_end_threshold: float = setting(
        0.5,
        "the caller's turn ends when the transcriber's end-of-turn probability passes this (Kyutai's "
        "0.5; higher waits for more certainty); a transcriber without that head: the energy VAD",
        low=0,
        high=0.99,
        group="model and GPU",
        advanced=True,
        metavar="P",
    )
    slots: int | None = setting(
        None,
        "concurrent conversations: a number, or auto (the default): as many as fit the GPU's free "
        "memory (see `pplex-trio fit`), 4 without a GPU",
        low=1,
        group="model and GPU",
        parse=parse_slots,
        metavar="N",
    )
    gpu_memory_reserve_gib: float = setting(
        2.0,
        "GPU memory that --slots auto leaves free (GiB, or 1536MiB …)",
        low=0,
        flag="--gpu-memory-reserve",
        group="model and GPU",
        parse=parse_gib,
        metavar="SIZE",
    )
    quantize: WeightFormat = setting(
        WeightFormat.NONE,
        "int8: half the weights' memory, for 16-24 GB cards (check it with `pplex-trio compare`)",
        group="model and GPU",
    )
    kv_cache: KVFormat = setting(KVFormat.MODEL, "fp8: twice the conversations per GPU", group="model and GPU")
    cuda_graph: CudaGraphMode = setting(
        CudaGraphMode.AUTO,
        "replay each tick as a CUDA graph recorded at load: auto (on CUDA; eager when its "
        "capture or check fails), on, off (--no-cuda-graph)",
        group="model and GPU",
    )
    compile: bool = setting(
        False,
        "run each tick through torch.compile, compiled at load (slow) and kept only if its first ticks "
        "give the eager tick's tokens (docs/BENCHMARKS.md: inexact on the CPU)",
        group="model and GPU",
        advanced=True,
    )
    queue_timeout: float = setting(
        60.0, "seconds one may wait for a slot", low=0, group="conversations", metavar="SECONDS"
    )
    max_session_seconds: float = setting(
        0.0,
        "a conversation is told why and closed once it has been live this long (0: no limit)",
        low=0,
        group="conversations",
        metavar="SECONDS",
    )
    max_prompt_chars: int = setting(1000, "persona length limit", low=1, group="conversations", metavar="N")
    client_timeout: float = setting(
        15.0,
        "a client that sends or reads nothing (not even a pong) this long is dropped and its slot freed",
        low=0.1,
        group="conversations",
        metavar="SECONDS",
    )
    drain_seconds: float = setting(
        0.0,
        "on SIGTERM, refuse new conversations and let the live ones go on this long (0: close at once)",
        low=0,
        group="conversations",
        metavar="SECONDS",
    )
    refuse_busy_upgrades: bool = setting(
        False,
        "answer a conversation the server cannot take with HTTP 503 before the WebSocket upgrade, so "
        "that a load balancer tries another replica (deploy/ sets it)",
        group="conversations",
    )
    shutdown_grace: float = setting(
        1.0, "seconds given to close on shutdown", low=0, group="conversations", metavar="SECONDS"
    )
    keepalive_interval: float = setting(
        2.0,
        "seconds between pings while a conversation is queued or being prepared",
        low=0.01,
        group="conversations",
        advanced=True,
        metavar="SECONDS",
    )
    open_timeout: float = setting(
        10.0,
        'raw protocol: seconds allowed before the {"type": "open"} message',
        low=0.01,
        group="conversations",
        advanced=True,
        metavar="SECONDS",
    )
    voice_dir: pathlib.Path | None = setting(
        None,
        "folder of voices: .pt voice prompts and recordings (.wav, .flac, .mp3, .ogg)",
        group="voices",
        metavar="DIR",
    )
    voice_uploads: VoiceUploads = setting(
        VoiceUploads.AUTO,
        "may clients add and delete voices (POST /api/voices): on, off, or auto (on while the "
        "server listens on loopback only)",
        group="voices",
    )
    voice_store: pathlib.Path | None = setting(
        None,
        "folder that keeps the added voices across restarts (default: one per model under the cache)",
        group="voices",
        metavar="DIR",
    )
    auth_token: str | None = setting(
        None,
        f"every route but /health and /ready needs this token; prefer the {AUTH_TOKEN_ENV} environment "
        "variable, which ps does not show",
        group="security",
        secret=True,
        metavar="TOKEN",
        env=AUTH_TOKEN_ENV,
    )
    twilio_auth_token: str | None = setting(
        None,
        f"your Twilio account's auth token: Twilio's requests to /telephony/twilio (the answer and the "
        f"stream) must then carry its X-Twilio-Signature; prefer the {TWILIO_AUTH_TOKEN_ENV} environment "
        "variable (docs/TELEPHONY.md)",
        group="security",
        secret=True,
        advanced=True,
        metavar="TOKEN",
        env=TWILIO_AUTH_TOKEN_ENV,
    )
    telnyx_public_key: str | None = setting(
        None,
        f"your Telnyx account's public key (base64, Telnyx's portal: Keys & Credentials): Telnyx's requests "
        f"to /telephony/telnyx/answer must then carry a valid, recent telnyx-signature-ed25519; or the "
        f"{TELNYX_PUBLIC_KEY_ENV} environment variable (docs/TELEPHONY.md)",
        group="security",
        secret=True,
        advanced=True,
        metavar="KEY",
        env=TELNYX_PUBLIC_KEY_ENV,
    )
    plivo_auth_token: str | None = setting(
        None,
        f"your Plivo (sub)account's auth token: Plivo's requests to /telephony/plivo/answer must then carry "
        f"its X-Plivo-Signature-V3; prefer the {PLIVO_AUTH_TOKEN_ENV} environment variable (docs/TELEPHONY.md)",
        group="security",
        secret=True,
        advanced=True,
        metavar="TOKEN",
        env=PLIVO_AUTH_TOKEN_ENV,
    )
    allowed_origins: str = setting(
        "",
        "web pages at these origins (comma-separated, like https://app.example.com; * for any) may open "
        "WebSockets besides the server's own pages",
        group="security",
        metavar="ORIGINS",
    )
    client_secret_seconds: int = setting(
        60,
        "a client secret (POST /v1/realtime/client_secrets: one Realtime call, for a page to hold instead of the "
        "token) expires this long after it is minted, unless its request asks for 10 to 7200",
        low=client_secrets.MIN_SECONDS,
        high=client_secrets.MAX_SECONDS,
        group="security",
        advanced=True,
        metavar="SECONDS",
    )
    max_connections_per_ip: int = setting(
        0,
        "open WebSockets allowed from one address; the next gets 429 (0: no limit)",
        low=0,
        group="security",
        metavar="N",
    )
    max_message_bytes: int = setting(
        MIB,
        "larger client messages are refused (close code 1009)",
        low=1024,
        group="security",
        advanced=True,
        metavar="BYTES",
    )
    access_log: bool = setting(
        False, "log one line per request and WebSocket (any token= masked)", group="observability"
    )
    record_dir: pathlib.Path | None = setting(
        None, "record every call in DIR (README: Call records)", flag="--record", group="observability", metavar="DIR"
    )
    record_retention_days: float = setting(
        30.0,
        "days a call record is kept before it is deleted (0: for ever)",
        low=0,
        flag="--record-retention",
        group="observability",
        advanced=True,
        metavar="DAYS",
    )
    record_quota_gib: float = setting(
        10.0,
        "disk space the call records may take (GiB, or 512MiB …; 0: no limit): beyond it the oldest are deleted",
        low=0,
        flag="--record-quota",
        group="observability",
        advanced=True,
        parse=parse_gib,
        metavar="SIZE",
    )
    opus_encoder: OpusEncoderPlacement = setting(
        OpusEncoderPlacement.AUTO,
        "where the Opus encoding of /api/chat output runs: process (libopus in a "
        "child process, off the event loop), inline (libopus on the event loop), sphn (sphn on the event "
        "loop), or auto (process when the system has libopus, else sphn)",
        group="timing",
        advanced=True,
    )
    inline_encoders: int = setting(
        4,
        "with the process encoder, this many conversations at a time encode on the event loop instead "
        "(~0.4 ms of it per frame each), which saves them ~2 ms of latency",
        low=0,
        group="timing",
        advanced=True,
        metavar="N",
    )
    framing: Framing = setting(
        Framing.ALIGNED,
        "Moshi input framing: aligned (frames end at the newest audio before each tick, "
        "lower latency) or naive (fixed 1920-sample boundaries)",
        group="timing",
        advanced=True,
    )

    def __post_init__(self) -> None:
        # Strings are welcome where a choice or a path is expected (tests, callers).
        if isinstance(self.slots, str):
            self.slots = parse_slots(self.slots)
        self.framing = Framing(self.framing)
        self.opus_encoder = OpusEncoderPlacement(self.opus_encoder)
        self.voice_uploads = VoiceUploads(self.voice_uploads)
        self.cuda_graph = CudaGraphMode(self.cuda_graph)
        for name in ("voice_dir", "voice_store", "static_dir", "ssl_dir", "certfile", "keyfile", "record_dir"):
            if isinstance(getattr(self, name), str):
                setattr(self, name, pathlib.Path(getattr(self, name)))
        check_settings(self)
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("--certfile and --keyfile go together: give both, or --ssl DIR instead")
        if self.certfile is not None and self.ssl_dir is not None:
            raise ValueError("give either --ssl DIR or --certfile/--keyfile, not both")
        if self.auth_token is not None and not self.auth_token.strip():
            raise ValueError(
                f"--auth-token (or {AUTH_TOKEN_ENV}) is empty; give a long random token, such as "
                "the output of: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
            )
        if self.twilio_auth_token is not None and not self.twilio_auth_token.strip():
            raise ValueError(
                f"--twilio-auth-token (or {TWILIO_AUTH_TOKEN_ENV}) is empty: give your Twilio account's "
                "auth token (Twilio's console, Account info), or leave it unset"
            )
        if self.telnyx_public_key is not None:
            try:
                telnyx.public_key(self.telnyx_public_key)
            except ValueError as exc:
                raise ValueError(f"--telnyx-public-key (or {TELNYX_PUBLIC_KEY_ENV}): {exc}") from None
        if self.plivo_auth_token is not None and not self.plivo_auth_token.strip():
            raise ValueError(
                f"--plivo-auth-token (or {PLIVO_AUTH_TOKEN_ENV}) is empty: give your Plivo account's "
                "auth token (Plivo's console, Overview), or leave it unset"
            )
        parse_origins(self.allowed_origins)  # a mistake is said now, not at the first browser
        try:
            self.webrtc_port_range  # noqa: B018 (a mistake is said now, not at the first call)
        except ValueError as exc:
            raise ValueError(f"--webrtc-ports: {exc}") from None

    @property
    def gpu_memory_reserve(self) -> int:
        """``--gpu-memory-reserve`` in bytes."""
        return int(self.gpu_memory_reserve_gib * 2**30)

    @property
    def record_quota(self) -> int:
        """``--record-quota`` in bytes (0: no quota)."""
        return int(self.record_quota_gib * 2**30)

    @property
    def voice_uploads_allowed(self) -> bool:
        """``--voice-uploads``, with ``auto`` resolved: on for a server that only loopback clients reach."""
        if self.voice_uploads is VoiceUploads.AUTO:
            return self.host in LOOPBACK_HOSTS
        return self.voice_uploads is VoiceUploads.ON

    @property
    def tls(self) -> bool:
        """Whether the server serves HTTPS and WSS (``--ssl`` or ``--certfile``)."""
        return self.ssl_dir is not None or self.certfile is not None

    @property
    def origins(self) -> frozenset[str]:
        """``--allowed-origins`` parsed: the origins a browser page may connect from (``*``: any)."""
        return parse_origins(self.allowed_origins)
