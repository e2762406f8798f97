"""Text side: the SentencePiece tokenizer, the persona prompt, streaming detokenization.

The LM's text stream carries one token per frame; most frames are padding
(id 3, ``PAD``) or end-of-padding (id 0, ``EPAD``).  For display we skip
those and turn the rest into text *incrementally*: a piece's text is
``decode(context + [token]) - decode(context)``, where ``context`` is the
previous piece.  That keeps the leading space of each word (SentencePiece's
``▁``) and drops control pieces.  Byte-fallback pieces (``<0xE2>``...) are
held back until they complete a UTF-8 character.
"""

from __future__ import annotations

import os
from pathlib import Path

import sentencepiece

PAD_NAMES = {0: "EPAD", 3: "PAD"}
_REPLACEMENT = "\ufffd"
_MAX_UTF8 = 4


class TextTokenizer:
    """A SentencePiece model plus the LM's conventions about special ids.

    ``text_card`` is the LM's text vocabulary: ids at or above it are the
    LM's own special tokens and never text.
    """

    def __init__(self, model: str | os.PathLike | bytes, text_card: int, pad_ids: tuple[int, ...] = (0, 3)):
        if isinstance(model, bytes):
            self.sp = sentencepiece.SentencePieceProcessor(model_proto=model)
        else:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=str(Path(model)))
        self.text_card = text_card
        self.pad_ids = pad_ids

    def encode(self, text: str) -> list[int]:
        """SentencePiece ids of ``text``, no special tokens added."""
        return list(self.sp.encode(text))

    def is_text(self, token: int) -> bool:
        """Whether ``token`` is a text piece: neither a pad id nor one of the LM's own ids (``>= text_card``)."""
        return token not in self.pad_ids and 0 <= token < self.text_card

    def offline_piece(self, token: int) -> str:
        """The reference offline tool's rendering: ``EPAD``/``PAD``, else the piece with ``▁`` as a space."""
        if token in PAD_NAMES:
            return PAD_NAMES[token]
        return self.sp.id_to_piece(token).replace("\u2581", " ")

    def decoder(self) -> StreamDecoder:
        """A fresh :class:`StreamDecoder` for one stream of tokens (one conversation)."""
        return StreamDecoder(self)


def wrap_persona(persona: str, template: str = "<system> {prompt} <system>") -> str:
    """Wrap a persona in the system tags, unless it already is (the reference's rule)."""
    cleaned = persona.strip()
    before, _, after = template.partition("{prompt}")
    if cleaned.startswith(before.strip()) and cleaned.endswith(after.strip()) and len(cleaned) > len(before.strip()):
        return cleaned
    return template.format(prompt=cleaned)


def persona_tokens(tokenizer: TextTokenizer, persona: str, template: str = "<system> {prompt} <system>") -> list[int]:
    """Token ids of the persona prompt; an empty persona has no prompt at all."""
    if len(persona) == 0:
        return []
    return tokenizer.encode(wrap_persona(persona, template))


class StreamDecoder:
    """Turns a conversation's text tokens into text pieces, one token at a time."""

    def __init__(self, tokenizer: TextTokenizer):
        self.tok = tokenizer
        self.context: list[int] = []
        self.pending: list[int] = []

    def push(self, token: int) -> str | None:
        """Text produced by ``token`` (with its leading space), or None."""
        if not self.tok.is_text(token):
            return None
        sp = self.tok.sp
        self.pending.append(token)
        ids = self.context + self.pending
        text = sp.decode(ids)
        if sp.is_byte(token) and text.endswith(_REPLACEMENT) and len(self.pending) < _MAX_UTF8:
            return None  # an incomplete UTF-8 character: wait for its next byte
        base = sp.decode(self.context) if self.context else ""
        piece = text[len(base) :] if text.startswith(base) else text
        if not self.context and sp.id_to_piece(self.pending[0]).startswith("\u2581") and not piece.startswith(" "):
            piece = " " + piece  # decode() drops the leading space of the very first piece
        self.context, self.pending = self.pending, []
        return piece or None
