"""Server settings: one typed object, defaults in plain units."""

from __future__ import annotations

import dataclasses
import pathlib

SECONDS = 1.0
KIB = 1024
MIB = 1024 * KIB


@dataclasses.dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8998  # the official server's port
    model: str = "echo"
    slots: int = 4
    device: str = "auto"
    cuda_graph: bool = False  # capture each tick's GPU work as a CUDA graph (CUDA only)
    voice_dir: pathlib.Path | None = None
    static_dir: pathlib.Path | None = None  # None: the web UI shipped with the package
    queue_size: int = 16  # connections that may wait for a slot
    queue_timeout: float = 60 * SECONDS  # how long one may wait
    max_prompt_chars: int = 1000
    max_message_bytes: int = 1 * MIB  # larger client messages are refused (1009)
    opus_encoder: str = "auto"  # "process", "libopus" or "sphn" (worker thread), or "auto"
    inline_encoders: int = 4  # with "process": this many conversations encode on the event loop
    framing: str = "aligned"  # Moshi input framing: "aligned" (low latency) or "naive"
    input_grace: float = 0.004  # aligned framing: how long a tick may wait for a due page (0: never)
    input_backlog_frames: int = 6  # input waiting for the engine, per slot (480 ms)
    output_backlog_frames: int = 8  # engine output waiting for the encoder, per session
    keepalive_interval: float = 2 * SECONDS  # pings while queued or prefilling
    send_timeout: float = 10 * SECONDS  # a client that reads nothing for this long is dropped
    open_timeout: float = 10 * SECONDS  # raw protocol: time allowed before the "open" message
    shutdown_grace: float = 1 * SECONDS  # conversations get this long to close on shutdown
    # The echo test engine's knobs (ignored by real models).
    echo_delay_frames: int = 1
    echo_prefill_steps: int = 12
    echo_step_seconds: float = 0.0
