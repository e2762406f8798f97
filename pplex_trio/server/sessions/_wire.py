"""What a wire protocol gives the session core: pure codec calls plus a few specifics.

The session core (``_session.py``) runs the same state machine and tasks for
every protocol; a :class:`WireProtocol` turns that protocol's messages into
events and engine output into messages.  Apart from ``encode`` (the Moshi
protocol's Opus encoder may run in another process), every method is a plain
function of its arguments and the protocol's own per-connection state: no
sockets, no clocks.  One instance serves one connection.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from typing import Any, ClassVar, Protocol

import numpy as np

from ..._conversation import CloseCode, Conversation, Outcome
from ...engine import OutputFrame
from ...protocol import EventError, ProtocolError
from ._transcript import TranscriptReader

Message = bytes | str  # one WebSocket message


class WebSocket(Protocol):
    """The part of a WebSocket a session uses (``AsgiWebSocket``; tests pass a fake)."""

    query_string: bytes
    client: str | None  # the peer's address (None: unknown)

    async def accept(self, subprotocol: str | None = None) -> None:
        """Accept the upgrade, offering ``subprotocol``."""

    async def receive(self) -> bytes | str:
        """The client's next message; a client that is gone unwinds the handler instead (it never returns)."""

    async def send(self, data: bytes | str) -> None:
        """Send one message: text for ``str``, binary for ``bytes``."""

    async def close(self, code: int, reason: str = "") -> None:
        """Send the close frame with ``code`` and ``reason``."""


@dataclasses.dataclass(frozen=True)
class InputAudio:
    """Audio from the client, still in the protocol's encoding (decoded by :meth:`WireProtocol.decode`)."""

    payload: Any


@dataclasses.dataclass(frozen=True)
class EndOfInput:
    """The client will send no more audio: flush what is pending, then end."""


@dataclasses.dataclass(frozen=True)
class Replies:
    """Messages to send back at once (answers to control events); nothing else changes."""

    messages: list[Message]


@dataclasses.dataclass(frozen=True)
class Restart:
    """New settings for a conversation under way (a persona change): its prompt runs again; then ``messages``."""

    conversation: Conversation
    messages: list[Message]


@dataclasses.dataclass(frozen=True)
class ResumeCall:
    """The opening resumes a paused conversation by its ``token`` (``settings_given``: it also named settings,
    which a resume ignores: the conversation keeps its own)."""

    token: str
    settings_given: bool


# What a resumed connection is told when its opening named settings.
IGNORED_ON_RESUME = (
    "a resumed call keeps its persona, voice and sampling: the settings sent with the resume were ignored"
)


@dataclasses.dataclass(frozen=True)
class Hangup:
    """The caller hung up (a carrier's ``stop``): the session ends at once, normally, with nothing flushed, and
    its slot is given back (outcome ``hangup``)."""


InputEvent = (
    InputAudio | EndOfInput | Replies | Restart | Hangup | None
)  # None: a well-formed message the server ignores


class Notices:
    """What an operator should hear of a session's protocol, once per session and kind (an event refused or
    taken without effect): the protocol notes them, the session core logs them."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._new: list[str] = []

    def note(self, text: str, key: str) -> None:
        """Keep ``text`` for the operator, unless one of the same ``key`` was noted before in this session."""
        if key not in self._seen:
            self._seen.add(key)
            self._new.append(text)

    def take(self) -> list[str]:
        """The notices since the last take, once each (the session core logs them)."""
        new, self._new = self._new, []
        return new

    def refused(self, exc: EventError) -> None:
        """A client event answered with an error (noted once per kind of refusal)."""
        self.note(f"refused{'' if exc.param is None else ' ' + exc.param}: {exc.message}", key=exc.code)


class PendingEvents:
    """Events a protocol has to send before the next frame's audio (answers made while decoding, a VAD's,
    a barge-in's): ``encode`` takes them, so they go out from the send task, in order.  More than
    ``MAX`` in one frame's time means the client floods us: 1008."""

    MAX = 256

    def __init__(self) -> None:
        self._messages: list[Message] = []

    def add(self, *messages: Message) -> None:
        """Queue ``messages`` for the next frame; ``ProtocolError`` (1008) beyond ``MAX`` in one frame's time."""
        if len(self._messages) + len(messages) > self.MAX:
            raise ProtocolError("too many events in one frame's time; slow down", CloseCode.POLICY)
        self._messages.extend(messages)

    def take(self) -> list[tuple[Message, None]]:
        """What waits, as ``encode``'s messages that carry no frame."""
        messages, self._messages = self._messages, []
        return [(message, None) for message in messages]


class WireProtocol(abc.ABC):
    """One connection's protocol: parse, decode, encode.  Raise ``ProtocolError`` for bad input.

    An adapter derives from one of the two openings, :class:`OpensWithQuery` or :class:`OpensWithMessage`
    (:data:`Wire`), and overrides the defaults below where its protocol has more to say.
    """

    name: str  # the ``protocol`` label of the metrics
    align_input: bool = False  # phase-aligned framing of the input (see InputFramer)
    early_audio: ClassVar[bool] = False  # the client may talk before "ready": keep that audio for the model

    subprotocol: str | None = None  # the WebSocket subprotocol to accept, if any
    caller: TranscriptReader | None = None  # the caller's words, read as frames are encoded (see hear)
    # It delivers a resume token, so a dropped connection pauses the call (a protocol's own, or, where the client
    # opts in, the connection's: the adapter sets it from the opening).
    resumable: bool = False

    def offer_resume(self, token: str, *, resumed: ResumeCall | None = None) -> None:
        """The token that resumes this conversation (``resumable`` protocols send it with their ``ready``;
        ``resumed``: this connection resumed it).  Only a ``resumable`` protocol is offered one."""
        raise NotImplementedError(f"the {self.name} protocol delivers no resume token")

    def resumes_from(self, previous: WireProtocol) -> None:
        """This connection resumed the conversation that ``previous`` (the dropped connection's protocol) spoke:
        it goes on with what that client was told (a session id, the settings, the audio formats)."""
        return None  # (nothing, for a protocol whose client was told nothing of its own)

    def hear(self, caller: TranscriptReader) -> None:
        """The session core's caller words (:class:`~._transcript.CallerTranscript`): an adapter that sends them
        takes the events of each frame's tick as it encodes that frame."""
        self.caller = caller

    def begins_at_once(self) -> bool:
        """The opening asked the model to speak now (a Realtime ``response.create``): the conversation is stepped
        from the handshake on, without waiting for the caller's first frame."""
        return False

    def opening_audio(self) -> InputAudio | None:
        """Audio carried by the message that completed the opening (``early_audio`` protocols), once."""
        return None

    def call_details(self) -> dict[str, Any]:
        """What a call record keeps of the call beyond the conversation's settings (a carrier's ids), if any."""
        return {}

    def take_notices(self) -> list[str]:
        """What the operator should hear of since the last call (an event refused or taken without effect)."""
        return []

    def greeting(self) -> list[Message]:
        """What to send as soon as the connection is accepted."""
        return []

    @abc.abstractmethod
    def parse(self, message: Message) -> InputEvent:
        """One client message after the opening."""

    def decode(self, payloads: list[Any]) -> list[np.ndarray]:
        """Payloads of :class:`InputAudio` events → float32 PCM at 24 kHz, one array each."""
        return payloads

    @abc.abstractmethod
    def keepalive(self, position: int | None) -> Message | None:
        """What to send while queued (``position``) or preparing (None), every keepalive interval."""

    @abc.abstractmethod
    def ready(self) -> list[Message]:
        """The conversation is live (the Moshi handshake)."""

    def output_stream(self) -> contextlib.AbstractContextManager[Any]:
        """Per-conversation encoder state, held while the send task runs."""
        return contextlib.nullcontext()

    @abc.abstractmethod
    async def encode(self, frames: list[OutputFrame]) -> list[tuple[Message, OutputFrame | None]]:
        """Messages for engine output, each with the frame whose audio it carries (None for text)."""

    def end_of_output(self) -> Message | None:
        """The message that says a flushed conversation's output is complete, if the protocol has one."""
        return None

    def error(self, message: str, code: int) -> Message | None:
        """What tells the client why the session ends (``code``: the close code to follow), before the close
        frame; None for a protocol with no such message (the close frame's reason says why)."""
        return None

    def closing(self, message: str | None, code: int, outcome: Outcome) -> list[Message]:
        """What goes out before the close frame (``outcome``: why the session ends):
        by default the error that says why, when there is one and the protocol can say it."""
        said = self.error(message, code) if message is not None else None
        return [said] if said is not None else []


class OpensWithQuery(WireProtocol):
    """A protocol whose conversation's settings are in the URL's query (Moshi): the session is admitted at once."""

    @abc.abstractmethod
    def conversation(self, query: bytes) -> Conversation | ResumeCall:
        """The conversation's settings from the query string, or the paused conversation it resumes."""


class OpensWithMessage(WireProtocol):
    """A protocol whose conversation's settings come in the client's first message or messages (the opening)."""

    opening_hint: ClassVar[str] = ""  # what the opening should be, for the timeout's error

    def resume_in_url(self, query: bytes) -> ResumeCall | None:
        """The URL's say, before any message: a resume it asks for by itself (then no opening is read, and no
        greeting sent), or None to read the opening."""
        return None

    @abc.abstractmethod
    def opening(self, query: bytes, message: bytes | str) -> Conversation | ResumeCall | Replies | Hangup:
        """One message of the opening (with the query string): the conversation, or replies and wait for more,
        or the end of the call before it began."""


Wire = OpensWithQuery | OpensWithMessage  # what the session core speaks
