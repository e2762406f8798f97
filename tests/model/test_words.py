"""Text tokens to words with times, and the end-of-turn decision; expected values worked out by hand."""

from __future__ import annotations

import pytest

from pplex_trio.model import TextTokenizer, TurnEnd, Word, WordAssembler, is_end_of_turn
from pplex_trio.model._tiny import train_tokenizer

_PIECES = {5: "\u2581hel", 6: "lo", 7: "\u2581world", 8: "!", 9: "\u2581a"}


class FakePieces:
    def id_to_piece(self, id: int) -> str:
        return _PIECES[id]

    def decode(self, ids: list[int]) -> str:
        return "".join(_PIECES[i] for i in ids).replace("\u2581", " ")


def test_words_and_their_times() -> None:
    # 12.5 steps a second (0.08 s each), text 0.5 s behind the audio: step n is about n * 0.08 - 0.5 s.
    words = WordAssembler(FakePieces(), text_card=400, delay_s=0.5)
    assert words.push(10, 0) == []  # EPAD with no word open
    assert words.push(11, 5) == []  # "▁hel" begins a word at step 11: 0.88 - 0.5 = 0.38 s
    assert words.push(12, 6) == []  # "lo" continues it
    assert words.push(13, 3) == []  # PAD
    assert words.push(14, 0) == [Word("hello", pytest.approx(0.38), pytest.approx(0.62))]  # EPAD ends it: 1.12 - 0.5
    assert words.push(20, 7) == []  # "▁world" at 1.60 - 0.5 = 1.10 s
    assert words.push(21, 8) == []  # "!" continues it
    # "▁a" begins the next word, which ends "world!" at step 22: 1.76 - 0.5 = 1.26 s
    assert words.push(22, 9) == [Word("world!", pytest.approx(1.10), pytest.approx(1.26))]
    assert words.push(23, -2) == []  # the transcriber's "no text"
    assert words.push(24, 400) == []  # the model's own ids (>= text_card) are not text
    # The open word ends one step after its last piece: 1.26 .. 23 * 0.08 - 0.5 = 1.34 s.
    assert words.flush() == [Word("a", pytest.approx(1.26), pytest.approx(1.34))]
    assert words.flush() == []


def test_times_never_fall_before_the_call() -> None:
    words = WordAssembler(FakePieces(), text_card=400, delay_s=2.5)
    assert words.time(3) == 0.0  # 0.24 - 2.5 < 0
    assert words.time(50) == pytest.approx(1.5)  # 4.0 - 2.5
    words.push(3, 9)
    assert words.flush() == [Word("a", 0.0, 0.0)]


def test_real_sentencepiece_pieces_make_words() -> None:
    tokenizer = TextTokenizer(train_tokenizer(400), text_card=400)
    ids = tokenizer.encode("Hello, how are you today?")
    words = WordAssembler(tokenizer.sp, text_card=400, delay_s=0.0)
    out = [w for step, token in enumerate(ids) for w in words.push(step, token)] + words.flush()
    assert [w.text for w in out] == ["Hello,", "how", "are", "you", "today?"]
    assert [w.start for w in out] == sorted(w.start for w in out)


def test_end_of_turn_threshold() -> None:
    assert not is_end_of_turn(0.5, 0.5)  # strictly above
    assert is_end_of_turn(0.51, 0.5)
    turn = TurnEnd(threshold=0.7)
    assert not turn.update(0.9, spoke=False)  # nothing said yet: no turn to end
    assert not turn.update(0.1, spoke=True)
    assert not turn.update(0.6, spoke=False)
    assert turn.update(0.71, spoke=False)  # ends here, once
    assert not turn.update(0.95, spoke=False)
    assert not turn.update(0.2, spoke=True)
    assert turn.update(0.8, spoke=False)
    with pytest.raises(ValueError, match="threshold"):
        TurnEnd(threshold=1.0)
