"""The vocabulary every layer shares: a conversation's settings, the audio frame, close codes.

A leaf module: it imports nothing from pplex_trio (nor Trio, torch or
prometheus), so the sans-IO protocols, the model, the engine and the server
can all use these names without pulling each other in (see
``docs/ARCHITECTURE.md``).
"""

from __future__ import annotations

import dataclasses
import enum

SAMPLE_RATE = 24_000
FRAME_SIZE = 1_920  # samples per frame at 24 kHz (Mimi's frame): the engine steps one frame per tick
FRAME_SECONDS = FRAME_SIZE / SAMPLE_RATE  # 0.08: one frame's audio, and the lockstep's period
FRAME_MS = FRAME_SIZE * 1000 // SAMPLE_RATE  # 80: the same in whole milliseconds (timelines kept in ms)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Per-conversation sampling settings, as the client asked for them.

    Defaults are the official client's.  ``greedy`` (argmax everywhere) is what
    the parity tests and ``pplex-trio offline --greedy`` use.  A seed of
    ``None`` means "pick one at random".
    """

    text_temperature: float = 0.7
    text_topk: int = 25
    audio_temperature: float = 0.8
    audio_topk: int = 250
    text_seed: int | None = None
    audio_seed: int | None = None
    greedy: bool = False
    # Accepted from the official client and validated; the reference ignores them.
    pad_mult: float = 0.0
    repetition_penalty_context: int = 64
    repetition_penalty: float = 1.0


@dataclasses.dataclass(frozen=True)
class Conversation:
    """What a new conversation asks of its slot.

    ``voice`` is a bare file name already checked against the engine's voice
    library (``None``: the engine's default, or no voice prompt).
    """

    persona: str = ""
    voice: str | None = None
    sampling: Sampling = Sampling()


CLOSE_BUDGET = 1.0  # s: the most a close (a last message, the close frame, an abort) waits on a client


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses (RFC 6455, section 7.4; ``docs/PROTOCOL.md``)."""

    NORMAL = 1000
    GOING_AWAY = 1001  # server shutting down
    UNSUPPORTED_DATA = 1003  # e.g. a text frame where only binary is spoken
    INVALID_PAYLOAD = 1007  # bad UTF-8 / JSON / Opus / PCM
    POLICY = 1008  # bad query parameter, prompt, voice; a client that does not read
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # every slot busy, queue full or wait timed out
