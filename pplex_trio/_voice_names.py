"""What a voice name may look like: one rule for the protocol and the voice library."""

from __future__ import annotations

MAX_VOICE_NAME = 255


def is_bare_voice_name(name: str) -> bool:
    """A bare ``NAME.pt`` file name: no path, no ``..``, not hidden, no NUL."""
    return bool(
        name
        and len(name) <= MAX_VOICE_NAME
        and name.endswith(".pt")
        and not name.startswith(".")
        and ".." not in name
        and not any(c in name for c in ("/", "\\", "\x00"))
    )
