"""Sampling per slot (seeds, top-k, greedy) and text detokenization."""

from __future__ import annotations

import io

import numpy as np
import pytest
import sentencepiece
import torch

from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import TextTokenizer, sample


def _conversation_tokens(model, samplings: list[Sampling], frames: int = 25) -> np.ndarray:
    """Run one conversation per slot on the same input; returns their output tokens [slots, frames, 17]."""
    engine = PersonaPlexEngine(model, len(samplings))
    steps = [engine.start(i, Conversation(persona="Hi.", voice="NATF0.pt", sampling=s))
             for i, s in enumerate(samplings)]
    assert len(set(steps)) == 1
    rng = np.random.RandomState(5)
    pcm = np.repeat((0.1 * rng.randn(1, frames * 1920)).astype(np.float32), len(samplings), axis=0)
    for _ in range(steps[0]):
        engine.step([SlotMode.PREFILL] * len(samplings), np.zeros_like(pcm[:, :1920]))
    tokens = []
    for f in range(frames):
        engine.step([SlotMode.LIVE] * len(samplings), pcm[:, f * 1920:(f + 1) * 1920])
        tokens.append(engine.last_tokens.copy())
    return np.stack(tokens, axis=1)


def test_seeds_reproduce_and_differ(tiny_model):
    a = Sampling(text_seed=1, audio_seed=2)
    b = Sampling(text_seed=10, audio_seed=20)
    tokens = _conversation_tokens(tiny_model, [a, b, a])
    np.testing.assert_array_equal(tokens[0], tokens[2])  # same seed, same tokens (whatever the other rows do)
    assert not np.array_equal(tokens[0, :, :9], tokens[1, :, :9])
    again = _conversation_tokens(tiny_model, [b])
    np.testing.assert_array_equal(again[0], tokens[1])  # and the batch position does not matter


def test_top_k_one_is_greedy(tiny_model):
    top1 = Sampling(text_topk=1, audio_topk=1, text_seed=3, audio_seed=4)
    tokens = _conversation_tokens(tiny_model, [top1, Sampling(greedy=True)])
    np.testing.assert_array_equal(tokens[0], tokens[1])


def test_sample_respects_top_k_and_temperature():
    torch.manual_seed(0)
    logits = torch.randn(4, 50).repeat(500, 1)  # 2000 rows, 4 distinct distributions
    gen = torch.Generator().manual_seed(0)
    noise = torch.empty(2000, 50).exponential_(generator=gen)
    topk = torch.tensor([1, 3, 10, 0]).repeat(500)
    temp = torch.tensor([1.0, 1.0, 0.5, 1.0]).repeat(500)
    greedy = torch.zeros(2000, dtype=torch.bool)
    drawn = sample(logits, temp, topk, greedy, noise).view(500, 4)
    order = logits[:4].argsort(dim=-1, descending=True)
    assert (drawn[:, 0] == order[0, 0]).all()
    assert set(drawn[:, 1].tolist()) == set(order[1, :3].tolist())  # exactly the top 3, all of them seen
    assert set(drawn[:, 2].tolist()) <= set(order[2, :10].tolist())
    assert len(set(drawn[:, 3].tolist())) > 10  # no top-k: a wide support
    # Frequencies follow softmax(logits / T) restricted to the top k.
    probs = torch.softmax(logits[1, order[1, :3]], dim=-1)
    freq = torch.tensor([(drawn[:, 1] == t).float().mean() for t in order[1, :3]])
    assert (freq - probs).abs().max() < 0.07
    assert (sample(logits, temp, topk, torch.ones_like(greedy), noise) == logits.argmax(-1)).all()
    assert (sample(logits, torch.zeros_like(temp), topk, greedy, noise) == logits.argmax(-1)).all()


@pytest.fixture(scope="module")
def byte_tokenizer() -> TextTokenizer:
    words = "the quick brown fox jumps over lazy dog hello world small corpus test teacher answer".split()
    rng = np.random.RandomState(0)
    text = [" ".join(rng.choice(words, 12)) for _ in range(200)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=300, model_type="unigram", byte_fallback=True,
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=3, num_threads=1, minloglevel=2)
    return TextTokenizer(model.getvalue(), text_card=300)


def _stream(tok: TextTokenizer, ids: list[int]) -> list[str | None]:
    decoder = tok.decoder()
    return [decoder.push(i) for i in ids]


def test_detokenizer_keeps_spaces_and_assembles_bytes(byte_tokenizer):
    tok = byte_tokenizer
    text = "Hello 😀 wörld, the fox"
    ids = tok.encode(text)
    assert any(tok.sp.is_byte(i) for i in ids)  # the emoji and ö are byte-fallback pieces
    with_pads = []
    for i in ids:
        with_pads += [i, 3, 0]  # PAD / EPAD between pieces, as the LM emits them
    pieces = _stream(tok, with_pads)
    assert "".join(p for p in pieces if p) == " " + text  # the first piece keeps its leading space too
    assert "😀" in pieces and " ⁇" not in "".join(p for p in pieces if p)
    assert all(p is None or "\ufffd" not in p for p in pieces)  # never half a character
    assert tok.sp.id_to_piece(ids[-1]) == "\u2581fox"  # a whole-word piece...
    assert [p for p in pieces if p][-2:] == [" the", " fox"]  # ...comes out with its space


def test_detokenizer_skips_specials_and_out_of_vocabulary(byte_tokenizer):
    tok = byte_tokenizer
    assert _stream(tok, [0, 3, 300, 1000]) == [None] * 4
    assert _stream(tok, [1, 2]) == [None, None]  # control pieces decode to nothing


def test_offline_rendering_matches_the_reference(golden_model):
    tok = golden_model.tokenizer
    assert [tok.offline_piece(i) for i in (0, 3, 1, 2)] == ["EPAD", "PAD", "<s>", "</s>"]
    piece = next(i for i in range(4, 128) if tok.sp.id_to_piece(i).startswith("\u2581"))
    assert tok.offline_piece(piece) == " " + tok.sp.id_to_piece(piece)[1:]
