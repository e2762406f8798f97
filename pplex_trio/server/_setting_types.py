"""The server settings' value types: the choices of ``serve``'s enumerated flags and the parser of ``--slots``.

They stand apart from ``ServerSettings`` (``_settings.py``) because the modules that act on a choice (the Opus
encoder placement in ``_encoders.py``, the framing in ``_app.py``) need the type, not the whole settings object;
each enum's values are the flag's accepted words, and each member's comment says what it does.
``LOOPBACK_HOSTS`` goes with ``VoiceUploads.AUTO``: the addresses that count as loopback only.
"""

from __future__ import annotations

import enum


def parse_slots(text: str) -> int | None:
    """``--slots``: a whole number, or ``auto`` (None: sized to the device)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a whole number nor auto") from None


def parse_port_range(text: str) -> range:
    """``--webrtc-ports``: ``FIRST-LAST``, two UDP ports (1024-65535), the first not above the last."""
    first, dash, last = text.partition("-")
    try:
        ports = range(int(first), int(last if dash else first) + 1)
    except ValueError:
        raise ValueError(f"{text!r} is not a port range like 40000-40999") from None
    if not ports or ports.start < 1024 or ports.stop > 65536:
        raise ValueError(f"{text!r}: give FIRST-LAST within 1024-65535, FIRST not above LAST")
    return ports


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


class CudaGraphMode(enum.StrEnum):
    """``--cuda-graph``: whether each tick's GPU work is recorded at load as a CUDA graph and replayed."""

    AUTO = "auto"  # on a CUDA device; eager when the capture or its check against an eager tick fails
    ON = "on"  # as auto, but refused on a device without CUDA
    OFF = "off"  # every tick eager

    @property
    def engine_argument(self) -> bool | None:
        """``PersonaPlexEngine``'s ``cuda_graph``: None (on CUDA), True, False."""
        return {CudaGraphMode.AUTO: None, CudaGraphMode.ON: True, CudaGraphMode.OFF: False}[self]


class VoiceUploads(enum.StrEnum):
    """``--voice-uploads``: whether clients may add (and delete) voices over HTTP."""

    AUTO = "auto"  # on while the server listens on loopback only
    ON = "on"
    OFF = "off"


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
