"""The vocabulary every layer shares: a conversation's settings, the audio frame, close codes, outcomes.

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


class Outcome(enum.Enum):
    """How a session ended.  Its value is the label the dashboards read (``pplex_sessions_ended_total``'s
    ``outcome``, a call record's ``ending``): renaming one breaks them.  :attr:`code` is its close code."""

    COMPLETED = "completed"  # a flush's output is all out (or the input ended before the conversation began)
    HANGUP = "hangup"  # the caller hung up (a phone call's ``stop``): nothing to flush
    TIME_LIMIT = "time_limit"  # --max-session-seconds
    CLIENT_CLOSED = "client_closed"  # the client left first: no close from us
    CLIENT_TIMEOUT = "client_timeout"  # a write to the client waited past --client-timeout
    BAD_REQUEST = "bad_request"  # its opening settings were refused
    PROTOCOL_ERROR = "protocol_error"  # a bad message once the conversation was under way
    QUEUE_FULL = "queue_full"  # no slot and no place in the queue
    QUEUE_TIMEOUT = "queue_timeout"  # no slot within --queue-timeout
    REJECTED = "rejected"  # the engine refused its settings (say, a voice it cannot load)
    ENGINE_ERROR = "engine_error"  # the engine failed it
    ENGINE_STALLED = "engine_stalled"  # the engine had stalled when it arrived
    INTERNAL_ERROR = "internal_error"  # a bug met in this session (ends it alone)
    TAKEN_OVER = "taken_over"  # a new connection resumed its conversation (its token): this one let go
    SHUTDOWN = "shutdown"  # the server stops
    DRAINING = "draining"  # the server drains: no new conversations

    @property
    def code(self) -> CloseCode | None:
        """The close code it ends with (None: the client closed first).  An error's own code replaces it for
        BAD_REQUEST, PROTOCOL_ERROR and REJECTED (``ProtocolError.code``, ``LeaseFailure.code``)."""
        return _CLOSE_CODES[self]


_CLOSE_CODES: dict[Outcome, CloseCode | None] = {
    Outcome.COMPLETED: CloseCode.NORMAL,
    Outcome.HANGUP: CloseCode.NORMAL,
    Outcome.TIME_LIMIT: CloseCode.NORMAL,
    Outcome.CLIENT_CLOSED: None,
    Outcome.CLIENT_TIMEOUT: CloseCode.POLICY,
    Outcome.BAD_REQUEST: CloseCode.POLICY,
    Outcome.TAKEN_OVER: CloseCode.POLICY,
    Outcome.PROTOCOL_ERROR: CloseCode.POLICY,
    Outcome.REJECTED: CloseCode.POLICY,
    Outcome.QUEUE_FULL: CloseCode.TRY_AGAIN_LATER,
    Outcome.QUEUE_TIMEOUT: CloseCode.TRY_AGAIN_LATER,
    Outcome.ENGINE_STALLED: CloseCode.TRY_AGAIN_LATER,
    Outcome.ENGINE_ERROR: CloseCode.INTERNAL_ERROR,
    Outcome.INTERNAL_ERROR: CloseCode.INTERNAL_ERROR,
    Outcome.SHUTDOWN: CloseCode.GOING_AWAY,
    Outcome.DRAINING: CloseCode.GOING_AWAY,
}
