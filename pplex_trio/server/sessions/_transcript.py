"""The caller's words of one conversation: the one owner every protocol, the record and the status page read.

The engine's transcriber writes a text piece per frame (``OutputFrame.heard_text``:
a piece beginning with a space or ``▁`` begins a word) about what the caller said
``Engine.transcript_delay`` seconds before that frame, and the probability that the
caller's turn has ended (``end_of_turn``).  :class:`CallerTranscript` is fed every
frame by the session's :class:`~._report.CallReport` (on the actor's task, before the
lossy outbox, so it misses nothing a slow client missed), and keeps:

* the words, each stamped with when it began and ended in the caller's audio (the
  frame's time minus the delay, as Kyutai's scripts stamp them);
* the turns: a turn ends when the end-of-turn probability passes
  ``--turn-end-threshold`` after the caller said something; a transcriber without
  that head falls back to the quality meter's energy VAD (the caller's end of speech,
  waited for until the words of its last frame are out);
* the events, in order, each with the engine tick that brought it: an adapter reads
  them with a :class:`TranscriptReader` as it encodes that tick's frame, so its
  caller's words go out in step with the agent's audio, whatever was dropped.

No protocol knowledge here: the adapters turn the events into their own.
"""

from __future__ import annotations

import dataclasses
import math

from ..._conversation import FRAME_SECONDS
from ...codec import WORD_START, TurnEnd, Word
from ...engine import OutputFrame

TURN_BY_MODEL = "model"  # the transcriber's end-of-turn head said so
TURN_BY_VAD = "vad"  # the energy VAD's end of speech (a transcriber without that head)
NO_TRANSCRIBER = (  # what a client that asks for the caller's words of a server without a transcriber is told
    "the caller's words were asked for, but this server transcribes nothing: start it with --transcribe "
    "(auto, tiny, or a Kyutai speech-to-text model such as kyutai/stt-1b-en_fr)"
)


@dataclasses.dataclass(frozen=True)
class HeardPiece:
    """A piece of the caller's words as the transcriber wrote it (a leading space begins a word), at ``at``
    seconds into the caller's audio, brought by engine tick ``tick``."""

    text: str
    at: float
    tick: int


@dataclasses.dataclass(frozen=True)
class TurnEnded:
    """The caller's turn ended (``by``: :data:`TURN_BY_MODEL` or :data:`TURN_BY_VAD`) at ``at`` seconds into
    their audio; its words, and their text; brought by engine tick ``tick``."""

    words: tuple[Word, ...]
    at: float
    tick: int
    by: str

    @property
    def text(self) -> str:
        """The turn's words, spaced."""
        return " ".join(word.text for word in self.words)


CallerEvent = HeardPiece | TurnEnded


class CallerTranscript:
    """One conversation's caller words and turns (see the module's docstring).

    ``delay`` is the engine's ``transcript_delay`` (None: the engine transcribes nothing, and this
    stays empty); ``threshold`` the end-of-turn probability that ends a turn.
    """

    def __init__(self, delay: float | None, threshold: float = 0.5):
        self.delay = delay
        self.enabled = delay is not None
        self.words: list[Word] = []  # every completed word of the call, in order
        self.turns: list[TurnEnded] = []
        self.events: list[CallerEvent] = []
        self._turn_end = TurnEnd(threshold)
        self._frames = 0  # frames observed: frame n is about n × 80 ms - delay into the caller's audio
        self._piece: list[str] = []  # the open word's pieces
        self._piece_start = 0.0
        self._piece_end = 0.0
        self._turn_words: list[Word] = []
        self._vad_wait: int | None = None  # frames left before the VAD's end of speech ends the turn
        self._was_speaking = False

    def time(self, frame: int) -> float:
        """Seconds into the caller's audio that frame ``frame``'s words are about (never before 0)."""
        return max(0.0, frame * FRAME_SECONDS - (self.delay or 0.0))

    def on_frame(self, frame: OutputFrame, caller_speaking: bool) -> list[CallerEvent]:
        """One frame of the conversation (``caller_speaking``: the energy VAD's decision so far); the events
        it brings, also kept in :attr:`events`."""
        if not self.enabled:
            return []
        n, self._frames = self._frames, self._frames + 1
        at = self.time(n)
        new: list[CallerEvent] = []
        piece = frame.heard_text
        if piece:
            self._add_piece(piece, at, self.time(n + 1))
            new.append(HeardPiece(piece, at, frame.tick))
        if frame.end_of_turn is not None:
            if self._turn_end.update(frame.end_of_turn, spoke=bool(piece)):
                new.extend(self._end_turn(at, frame.tick, TURN_BY_MODEL))
        else:
            new.extend(self._vad_turn(caller_speaking, at, frame.tick))
        self.events.extend(new)
        return new

    def finish(self, tick: int) -> list[CallerEvent]:
        """The call is over: the open turn, if it has words, ends here."""
        new = self._end_turn(self.time(self._frames), tick, TURN_BY_VAD) if self.enabled else []
        self.events.extend(new)
        return new

    def reader(self, *, from_now: bool = False) -> TranscriptReader:
        """A cursor over :attr:`events` from the start (``from_now``: from the next one), for one adapter."""
        reader = TranscriptReader(self)
        if from_now:
            reader.take()  # (what the connection before it was given)
        return reader

    def latest(self) -> str:
        """The caller's latest words, for ``/api/sessions``: the open turn's, else the last turn's."""
        words = [*self._turn_words, *([] if not self._piece else [Word(self._open_text(), 0, 0)])]
        if words:
            return " ".join(word.text for word in words)
        return self.turns[-1].text if self.turns else ""

    def as_dict(self) -> dict[str, object]:
        """The call record's ``caller`` object: the words with their times (seconds into the caller's audio)."""
        words = [*self.words, *self._open_word()]
        return {
            "delay_s": self.delay,
            "words": [{"text": w.text, "start": round(w.start, 3), "end": round(w.end, 3)} for w in words],
            "turns": [
                {
                    "start": round(t.words[0].start, 3),
                    "end": round(t.words[-1].end, 3),
                    "ended_at": round(t.at, 3),
                    "by": t.by,
                    "text": t.text,
                }
                for t in self.turns
            ],
        }

    # -- words and turns

    def _open_text(self) -> str:
        return "".join(self._piece).replace(WORD_START, " ").strip()

    def _open_word(self) -> list[Word]:
        text = self._open_text()
        return [Word(text, self._piece_start, self._piece_end)] if text else []

    def _close_word(self) -> None:
        for word in self._open_word():
            self.words.append(word)
            self._turn_words.append(word)
        self._piece = []

    def _add_piece(self, piece: str, start: float, end: float) -> None:
        if piece[0] in (" ", WORD_START) or not self._piece:
            self._close_word()
            self._piece_start = start
        self._piece.append(piece)
        self._piece_end = end

    def _end_turn(self, at: float, tick: int, by: str) -> list[CallerEvent]:
        self._close_word()
        self._vad_wait = None
        if not self._turn_words:
            return []
        ended = TurnEnded(tuple(self._turn_words), at, tick, by)
        self._turn_words = []
        self.turns.append(ended)
        return [ended]

    def _vad_turn(self, speaking: bool, at: float, tick: int) -> list[CallerEvent]:
        """No end-of-turn head: the VAD's end of speech ends the turn once the words of its frame are out
        (the delay beyond the VAD's own hangover of ~480 ms)."""
        if self._was_speaking and not speaking:
            self._vad_wait = math.ceil(max(0.0, (self.delay or 0.0) - 0.48) / FRAME_SECONDS)
        self._was_speaking = speaking
        if self._vad_wait is None:
            return []
        if self._vad_wait > 0:
            self._vad_wait -= 1
            return []
        return self._end_turn(at, tick, TURN_BY_VAD)


class TranscriptReader:
    """One adapter's place in a :class:`CallerTranscript`'s events."""

    def __init__(self, transcript: CallerTranscript):
        self.transcript = transcript
        self._next = 0

    @property
    def enabled(self) -> bool:
        """Whether the engine transcribes the caller (else no event ever comes)."""
        return self.transcript.enabled

    def take(self, tick: int | None = None) -> list[CallerEvent]:
        """The events not yet taken that came with engine ticks up to ``tick`` (None: all of them)."""
        events = self.transcript.events
        end = self._next
        while end < len(events) and (tick is None or events[end].tick <= tick):
            end += 1
        taken, self._next = events[self._next : end], end
        return taken
