"""The caller's words in the session core: pieces to timed words, turns from the model's head or the VAD."""

from __future__ import annotations

import numpy as np

from pplex_trio.engine import OutputFrame
from pplex_trio.server.sessions._transcript import TURN_BY_MODEL, TURN_BY_VAD, CallerTranscript, HeardPiece, TurnEnded

_SILENCE = np.zeros(1920, np.float32)


def _frame(tick: int, piece: str | None = None, turn: float | None = None) -> OutputFrame:
    return OutputFrame(_SILENCE, None, tick, heard_text=piece, end_of_turn=turn)


def test_pieces_become_words_stamped_in_the_callers_audio_and_the_head_ends_the_turn() -> None:
    transcript = CallerTranscript(delay=0.4, threshold=0.5)
    pieces = {10: " hel", 11: "lo", 13: " world"}
    events = []
    for n in range(20):
        events += transcript.on_frame(_frame(100 + n, pieces.get(n), 0.9 if n == 16 else 0.1), False)
    assert [e.text for e in events if isinstance(e, HeardPiece)] == [" hel", "lo", " world"]
    (turn,) = [e for e in events if isinstance(e, TurnEnded)]
    assert turn.text == "hello world" and turn.by == TURN_BY_MODEL and turn.tick == 116
    hello, world = transcript.words
    assert (hello.text, round(hello.start, 2), round(hello.end, 2)) == ("hello", 0.4, 0.56)  # 10 × 0.08 - 0.4
    assert (world.text, round(world.start, 2)) == ("world", 0.64)
    assert transcript.latest() == "hello world"
    assert transcript.as_dict()["words"][0] == {"text": "hello", "start": 0.4, "end": 0.56}


def test_a_high_probability_before_any_word_ends_no_turn() -> None:
    transcript = CallerTranscript(delay=0.5, threshold=0.5)
    assert not [e for n in range(10) for e in transcript.on_frame(_frame(n, None, 0.99), False)]


def test_without_the_head_the_vads_end_of_speech_ends_the_turn() -> None:
    transcript = CallerTranscript(delay=0.48, threshold=0.5)
    events = []
    for n in range(12):
        events += transcript.on_frame(_frame(n, " hi" if n == 3 else None), 2 <= n < 8)
    (turn,) = [e for e in events if isinstance(e, TurnEnded)]
    assert (turn.text, turn.by, turn.tick) == ("hi", TURN_BY_VAD, 8)


def test_a_reader_takes_events_up_to_the_tick_it_encodes() -> None:
    transcript = CallerTranscript(delay=0.0)
    reader = transcript.reader()
    for n in range(4):
        transcript.on_frame(_frame(n, f" w{n}"), False)
    assert [e.tick for e in reader.take(1)] == [0, 1]
    assert [e.tick for e in reader.take()] == [2, 3]
    assert reader.take() == []
    assert transcript.finish(4)[0].text == "w0 w1 w2 w3"


def test_no_transcriber_no_words() -> None:
    transcript = CallerTranscript(None)
    assert transcript.on_frame(_frame(0, " hi", 0.9), True) == [] and transcript.as_dict()["words"] == []
