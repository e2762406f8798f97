"""A transcriber's text tokens as words stamped with when they were said, and the end of the caller's turn.

Pure: no torch, no model.  Kyutai's STT models write one text token per
80 ms step; most are padding (``PAD``, 3) and a word is preceded by an
end-of-padding token (``EPAD``, 0), Kyutai's word boundary.  A word also
begins at a SentencePiece piece starting with ``▁``; pieces without it
continue the current word.  A word is complete when the next one begins,
at an ``EPAD``, or at :meth:`WordAssembler.flush`.

The text runs ``delay_s`` behind the audio (``audio_delay_seconds`` of the
model's ``stt_config``, plus any silence fed before the caller's audio), so
a token chosen at step ``n`` (the row's ``n``-th frame, 0-based) is about
what the caller said at ``n / frame_rate - delay_s`` seconds into their
audio (never before 0), the stamp Kyutai's own scripts give.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

WORD_START = "\u2581"
"""SentencePiece's word-start mark (``▁``)."""


class Pieces(Protocol):
    """What the word assembler needs of a tokenizer (a ``sentencepiece.SentencePieceProcessor`` has both)."""

    def id_to_piece(self, id: int, /) -> str:
        """The piece of ``id`` (``▁`` marks the start of a word)."""

    def decode(self, ids: list[int], /) -> str:
        """The text of ``ids`` (byte-fallback pieces joined into characters)."""


@dataclasses.dataclass(frozen=True)
class Word:
    """One word the caller said: its text, and when (seconds into the caller's audio) it began and ended."""

    text: str
    start: float
    end: float


class WordAssembler:
    """One row's text tokens, one per step, turned into :class:`Word` s as they complete.

    ``pad_ids`` are skipped (``end_of_padding_id`` also ends the current
    word); so are ids outside ``0..text_card - 1`` (the model's own
    tokens, and the transcriber's "no text" value).
    """

    def __init__(
        self,
        pieces: Pieces,
        *,
        text_card: int,
        delay_s: float,
        frame_rate: float = 12.5,
        pad_ids: tuple[int, ...] = (0, 3),
        end_of_padding_id: int = 0,
    ):
        self.pieces = pieces
        self.text_card = text_card
        self.delay_s = delay_s
        self.frame_rate = frame_rate
        self.pad_ids = pad_ids
        self.end_of_padding_id = end_of_padding_id
        self._ids: list[int] = []
        self._first_step = 0
        self._last_step = 0

    def time(self, step: int) -> float:
        """Seconds into the caller's audio that step ``step``'s text is about: ``step / frame_rate - delay_s``,
        at least 0."""
        return max(0.0, step / self.frame_rate - self.delay_s)

    def push(self, step: int, token: int) -> list[Word]:
        """The text token of step ``step`` (steps increasing); returns the words it completes (none or one)."""
        done: list[Word] = []
        if token == self.end_of_padding_id:
            done = self._complete(step)
        elif token in self.pad_ids or not 0 <= token < self.text_card:
            pass
        else:
            if self.pieces.id_to_piece(token).startswith(WORD_START):
                done = self._complete(step)
            if not self._ids:
                self._first_step = step
            self._ids.append(token)
            self._last_step = step
        return done

    def flush(self) -> list[Word]:
        """The word still open, if any, ending one step after its last piece (at the end of a turn or a call)."""
        return self._complete(self._last_step + 1)

    def _complete(self, end_step: int) -> list[Word]:
        if not self._ids:
            return []
        text = self.pieces.decode(self._ids).strip()
        start, self._ids = self._first_step, []
        return [Word(text, self.time(start), self.time(end_step))] if text else []


def is_end_of_turn(probability: float, threshold: float = 0.5) -> bool:
    """Whether one step's end-of-turn probability says the turn has ended: above ``threshold`` (Kyutai's
    scripts use 0.5; higher waits for more certainty, lower answers sooner)."""
    return probability > threshold


class TurnEnd:
    """One row's end-of-turn decisions: fires once per turn, when the probability first exceeds ``threshold``
    after the caller said something (so a long silence does not end a turn again and again)."""

    def __init__(self, threshold: float = 0.5):
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"the end-of-turn threshold must be in [0, 1), not {threshold}")
        self.threshold = threshold
        self.armed = False

    def update(self, probability: float, spoke: bool) -> bool:
        """One step: ``spoke`` when the step gave a word or a text piece; returns whether the turn ends here."""
        if spoke:
            self.armed = True
            return False
        if self.armed and is_end_of_turn(probability, self.threshold):
            self.armed = False
            return True
        return False
