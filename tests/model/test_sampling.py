"""Sampling per slot (seeds, top-k, greedy) and text detokenization."""

from __future__ import annotations

import io

import numpy as np
import pytest
import sentencepiece
import torch

from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import RowNoise, TextTokenizer, sample
from pplex_trio.model._sampling import mix32


def _conversation_tokens(model, samplings: list[Sampling], frames: int = 25) -> np.ndarray:
    """Run one conversation per slot on the same input; returns their output tokens [slots, frames, 17]."""
    engine = PersonaPlexEngine(model, len(samplings))
    steps = [
        engine.start(i, Conversation(persona="Hi.", voice="NATF0.pt", sampling=s)) for i, s in enumerate(samplings)
    ]
    assert len(set(steps)) == 1
    rng = np.random.RandomState(5)
    pcm = np.repeat((0.1 * rng.randn(1, frames * 1920)).astype(np.float32), len(samplings), axis=0)
    engine.prefill({i: n for i, n in enumerate(steps)})
    tokens = []
    for f in range(frames):
        engine.step([SlotMode.LIVE] * len(samplings), pcm[:, f * 1920 : (f + 1) * 1920])
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


def _fmix32_numpy(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's fmix32 written with numpy's wrapping uint32 arithmetic (the reference)."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x85EBCA6B)
        x ^= x >> np.uint32(13)
        x *= np.uint32(0xC2B2AE35)
        x ^= x >> np.uint32(16)
    return x


def test_mix32_is_murmur3_fmix32():
    values = np.concatenate(
        [
            np.arange(1000),
            np.random.RandomState(0).randint(0, 2**32, 5000, dtype=np.uint64),
            [2**32 - 1, 2**31, 2**16 - 1],
        ]
    ).astype(np.int64)
    got = mix32(torch.from_numpy(values)).numpy()
    np.testing.assert_array_equal(got, _fmix32_numpy(values).astype(np.int64))
    assert got[1] == 0x514E28B7  # fmix32(1), a published value


def test_row_noise_is_exponential_and_depends_only_on_the_rows_seed_and_step():
    noise = RowNoise(4, 3000, 2, 500, "cpu")
    for row, seeds in enumerate([(1, 2), (3, 4), (1, 2), (2**62 + 5, 7)]):
        noise.seed(row, *seeds)
    advance = torch.tensor([True, True, True, False])
    first_text, first_audio = noise.draw(advance)
    second_text, _ = noise.draw(advance)
    assert torch.equal(first_text[0], first_text[2]) and torch.equal(first_audio[0], first_audio[2])
    assert not torch.equal(first_text[0], first_text[1])
    assert not torch.equal(first_text[0], second_text[0])  # the next step has fresh noise...
    assert torch.equal(first_text[3], second_text[3])  # ...only for rows that advanced
    assert noise.steps.tolist() == [2, 2, 2, 0]
    # Another batch, another position, the same seed and step: the same noise.
    other = RowNoise(2, 3000, 2, 500, "cpu")
    other.seed(1, 1, 2)
    assert torch.equal(other.draw(torch.tensor([True, True]))[0][1], first_text[0])
    # Exp(1): mean 1, variance 1, P(E > t) = exp(-t); no two rows or steps correlated.
    sample_ = torch.cat([first_text.ravel(), second_text[:3].ravel(), first_audio.ravel()]).double()
    assert torch.isfinite(sample_).all() and (sample_ > 0).all()
    assert abs(sample_.mean() - 1) < 0.02 and abs(sample_.var() - 1) < 0.05
    for t in (0.5, 1.0, 2.0, 4.0):
        assert abs((sample_ > t).double().mean() - np.exp(-t)) < 0.01
    assert abs(np.corrcoef(first_text[0].numpy(), first_text[1].numpy())[0, 1]) < 0.06
    assert abs(np.corrcoef(first_text[0].numpy(), second_text[0].numpy())[0, 1]) < 0.06


def test_row_noise_reset_restarts_the_masked_rows_only():
    noise = RowNoise(3, 50, 1, 8, "cpu")
    for row in range(3):
        noise.seed(row, 10 + row, 20 + row)
    every = torch.ones(3, dtype=torch.bool)
    noise.draw(every)
    untouched = noise.seeds.clone(), noise.bases.clone(), noise.steps.clone()
    noise.reset(torch.tensor([False, True, False]))
    assert noise.seeds[1].tolist() == [0, 0] and noise.bases[1].tolist() == [0, 0] and noise.steps[1] == 0
    for before, after in zip(untouched, (noise.seeds, noise.bases, noise.steps)):
        assert torch.equal(before[[0, 2]], after[[0, 2]])
    fresh = RowNoise(3, 50, 1, 8, "cpu")
    fresh.seed(1, 0, 0)  # a zero seed's hash is zero: a reset row draws what a row seeded with zeros does
    assert torch.equal(noise.draw(every)[0][1], fresh.draw(every)[0][1])


def test_sampling_with_row_noise_follows_the_softmax():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    rows, steps = 64, 40
    noise = RowNoise(rows, logits.numel(), 1, 8, "cpu")
    for row in range(rows):
        noise.seed(row, row, 1000 + row)
    temp, topk = torch.full((rows,), 0.8), torch.full((rows,), 4)
    drawn = torch.stack(
        [
            sample(
                logits.expand(rows, -1),
                temp,
                topk,
                torch.zeros(rows, dtype=torch.bool),
                noise.draw(torch.ones(rows, dtype=torch.bool))[0],
            )
            for _ in range(steps)
        ]
    )
    expected = torch.softmax(logits[:4] / 0.8, dim=0)
    freq = torch.stack([(drawn == i).double().mean() for i in range(4)])
    assert (drawn < 4).all()  # top 4 only
    assert (freq - expected).abs().max() < 0.03, (freq, expected)


@pytest.fixture(scope="module")
def byte_tokenizer() -> TextTokenizer:
    words = "the quick brown fox jumps over lazy dog hello world small corpus test teacher answer".split()
    rng = np.random.RandomState(0)
    text = [" ".join(rng.choice(words, 12)) for _ in range(200)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text),
        model_writer=model,
        vocab_size=300,
        model_type="unigram",
        byte_fallback=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        num_threads=1,
        minloglevel=2,
    )
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
