"""What a ``--model`` value names: a built-in, a local folder, or a Hugging Face repo id.

A leaf module (no torch): the model loader and the server's official-client
lookup share this one rule.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_REPO = "nvidia/personaplex-7b-v1"
RL_REPO = "kyutai/personaplex-rl-seamless"  # the same architecture, RL-tuned for turn-taking and backchannels
STT_DEFAULT_REPO = "kyutai/stt-1b-en_fr"  # the caller's words (--transcribe auto): 0.5 s behind, an end-of-turn head

# What each known checkpoint's card says of its licence (said at load; other models: their card's ``license``).
LICENCES = {
    DEFAULT_REPO: "NVIDIA Open Model License (commercial use allowed)",
    RL_REPO: "CC BY-NC 4.0 with the NVIDIA Open Model License: NON-COMMERCIAL use only",
    # Kyutai's streaming speech-to-text models (their cards: CC-BY 4.0, commercial use allowed with attribution).
    STT_DEFAULT_REPO: "CC-BY 4.0 (credit Kyutai)",
    "kyutai/stt-2.6b-en": "CC-BY 4.0 (credit Kyutai)",
}


def is_repo_id(source: str) -> bool:
    """``owner/name``: one slash, not a path (``.``, ``/``, ``~``), and no such local file or folder."""
    return source.count("/") == 1 and not source.startswith((".", "/", "~")) and not Path(source).expanduser().exists()
