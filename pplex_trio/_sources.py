"""What a ``--model`` value names: a built-in, a local folder, or a Hugging Face repo id.

A leaf module (no torch): the model loader and the server's official-client
lookup share this one rule.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_REPO = "nvidia/personaplex-7b-v1"


def is_repo_id(source: str) -> bool:
    """``owner/name``: one slash, not a path (``.``, ``/``, ``~``), and no such local file or folder."""
    return (source.count("/") == 1 and not source.startswith((".", "/", "~"))
            and not Path(source).expanduser().exists())
