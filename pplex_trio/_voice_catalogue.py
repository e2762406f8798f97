"""The voice catalogue: which voice names exist, what a name may look like, where its file is.

One set of rules for everyone who names voices: the protocol (a client's
``voice_prompt``), the model's voice library, the echo test engine and the
tiny demo model.  A leaf module (no torch, no Trio, nothing from
pplex_trio) so that each of them can use it without importing the others.

A voice is a bare file name resolved only inside one voice folder:
``NAME.pt`` (the stored voice prompt NVIDIA's voices come as) or a recording,
``NAME.wav`` / ``.flac`` / ``.mp3`` / ``.ogg`` (made into a voice prompt by
the model, as NVIDIA's server does).  Anything with a path separator or
``..`` is refused, so a client cannot make the server read other files.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_VOICE_NAME = 255
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")
"""Recordings a voice may be made from (whatever sphn reads)."""

# The voices the official web client offers (and PersonaPlex's voices.tgz holds), in the client's order.
OFFICIAL_VOICES: tuple[str, ...] = tuple(
    [f"NAT{g}{i}.pt" for g in "FM" for i in range(4)] + [f"VAR{g}{i}.pt" for g in "FM" for i in range(5)]
)

# OpenAI's Realtime voice names, each given one of PersonaPlex's voices, so that a framework's default
# voice (LiveKit's "marin", Pipecat's "alloy") works. A fixed table by gender of the name's usual
# voice, not a likeness of timbre; on a server without the named voice, the engine's default voice.
OPENAI_VOICES: dict[str, str] = {
    "alloy": "NATF0.pt",
    "coral": "NATF1.pt",
    "marin": "NATF2.pt",
    "sage": "NATF3.pt",
    "shimmer": "VARF0.pt",
    "ash": "NATM0.pt",
    "ballad": "NATM1.pt",
    "cedar": "NATM2.pt",
    "echo": "NATM3.pt",
    "verse": "VARM0.pt",
}


class VoiceNotFoundError(LookupError):
    """The requested voice is not a valid name, or not in the voice folder."""


def is_bare_voice_name(name: str) -> bool:
    """A bare ``NAME.pt`` (or recording) file name: no path, no ``..``, not hidden, no NUL."""
    return bool(
        name
        and len(name) <= MAX_VOICE_NAME
        and name.lower().endswith((".pt", *AUDIO_SUFFIXES))
        and not name.startswith(".")
        and ".." not in name
        and not any(c in name for c in ("/", "\\", "\x00"))
    )


def check_voice_name(name: str) -> str:
    """Validate a client-supplied voice name; returns it unchanged.

    Error handling: raises :class:`VoiceNotFoundError` (saying what is
    allowed) for anything but a bare ``NAME.pt``.
    """
    if not is_bare_voice_name(name):
        raise VoiceNotFoundError(
            f"invalid voice name {name!r}: use a bare file name ending in .pt (like NATF0.pt) "
            f"or in {', '.join(AUDIO_SUFFIXES)} (a recording)"
        )
    return name


def voice_files(folder: str | os.PathLike[str]) -> list[str]:
    """The voices of a folder: sorted names of its regular ``*.pt`` and recording files that are bare names.

    Only names :func:`voice_path` would accept are listed, so every listed
    voice can be asked for.  Error handling: ``FileNotFoundError`` (telling
    the user what to pass) when the folder does not exist.
    """
    path = Path(folder)
    if not path.is_dir():
        raise FileNotFoundError(
            f"voice directory {path} does not exist: pass --voice-dir with a folder of .pt files or recordings"
        )
    return sorted(p.name for p in path.iterdir() if is_bare_voice_name(p.name) and p.is_file())


def voice_path(folder: str | os.PathLike[str], name: str) -> Path:
    """The file of voice ``name`` in ``folder``: the name is checked first, then that the file exists.

    Error handling: :class:`VoiceNotFoundError` for an invalid name, or for
    a voice that is not there (the message lists the first available ones).
    """
    check_voice_name(name)
    path = Path(folder) / name
    if not path.is_file():
        known = voice_files(folder)[:20] if Path(folder).is_dir() else []
        raise VoiceNotFoundError(f"unknown voice {name!r}; available: {', '.join(known) or 'none'}")
    return path
