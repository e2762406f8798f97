"""``--quantize int8`` and ``--kv-cache fp8`` on the CPU: the arithmetic, the ring, the engine, the files.

Expected values are computed here in float64 from the float weights (the
int8 error bound is half a quantization step per weight, summed over the
input), not by the code under test.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import sphn
import torch

from pplex_trio._cli import main
from pplex_trio._precision import KVFormat, Precision, WeightFormat
from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import LMGen, TransformerConfig, _quant, load_model
from pplex_trio.model._checkpoint import read_safetensors
from pplex_trio.model._loading import resolve_checkpoint, write_quantized
from pplex_trio.model._transformer import Fp8TransformerState, StreamingTransformer

INT8_FP8 = Precision(WeightFormat.INT8, KVFormat.FP8)


def _weights(kind: str, n: int = 48, k: int = 64) -> torch.Tensor:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1))
    if kind == "zero row":
        w[5] = 0
    elif kind == "outlier per row":
        w[torch.arange(n), torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(2))] = 1e4
    return w


@pytest.fixture(params=["fused", "converted"])
def int8_path(request, monkeypatch):
    """Both ways of computing the product: ``_weight_int8pack_mm``, and converting the weight."""
    monkeypatch.setitem(_quant._FUSED, ("cpu", torch.float32), request.param == "fused")
    monkeypatch.setitem(_quant._FUSED, ("cpu", torch.bfloat16), request.param == "fused")
    return request.param


@pytest.mark.parametrize("kind", ["random", "zero row", "outlier per row"])
def test_int8_linear_is_within_half_a_step_of_the_float_product(kind, int8_path):
    w = _weights(kind)
    x = torch.randn(2, 3, w.shape[1], generator=torch.Generator().manual_seed(3))
    weight, scale = _quant.quantize_rows(w, torch.float32)
    got = _quant.int8_linear(x, weight, scale).double()
    exact = x.double() @ w.double().T
    step = w.double().abs().amax(dim=1) / 127  # one quantization step per output row
    bound = x.double().abs().sum(-1, keepdim=True) * step / 2 * (1 + 1e-4) + 1e-3
    assert got.shape == exact.shape == (2, 3, w.shape[0])
    assert ((got - exact).abs() <= bound).all()
    if kind == "zero row":
        assert (got[..., 5] == 0).all() and (weight[5] == 0).all()
    if kind == "random":  # and it is not the float product by accident: the error is there, and small
        assert 0 < (got - exact).abs().max() < 0.02 * exact.abs().max()


def test_int8_linear_in_bfloat16(int8_path):
    w = _weights("random")
    x = torch.randn(4, w.shape[1], generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    weight, scale = _quant.quantize_rows(w, torch.bfloat16)
    got = _quant.int8_linear(x, weight, scale)
    exact = x.double() @ w.double().T
    assert got.dtype == torch.bfloat16
    assert (got.double() - exact).norm() / exact.norm() < 0.02


def _fp8_round_trip(x: torch.Tensor) -> torch.Tensor:
    """Independent of the ring: each vector scaled to e4m3's range, rounded by torch's cast, scaled back."""
    scale = x.abs().amax(-1, keepdim=True) / 448
    return (x / scale).to(torch.float8_e4m3fn).to(torch.float32) * scale


def test_fp8_ring_holds_the_rounded_keys_across_a_wrap():
    cfg = TransformerConfig(d_model=32, num_heads=2, num_layers=2, dim_feedforward=64, context=8)
    torch.manual_seed(0)
    model = StreamingTransformer(cfg).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    plain, fp8 = model.init_state(2), model.init_state(2, kv=KVFormat.FP8)
    assert isinstance(fp8, Fp8TransformerState) and fp8.keys.dtype == torch.uint8
    x = torch.randn(2, 21, 32)
    outs = []
    with torch.no_grad():
        for t in range(21):  # 21 positions through a ring of 8: it wraps twice
            outs.append((model(x[:, t : t + 1], plain), model(x[:, t : t + 1], fp8)))
            # Layer 0's keys come straight from the input: the fp8 ring holds exactly their rounding.
            keys, values = fp8.read(0, torch.float32)
            written = slice(0, min(t + 1, cfg.context))
            torch.testing.assert_close(
                keys[:, :, written], _fp8_round_trip(plain.keys[0][:, :, written]), rtol=0, atol=1e-6
            )
            torch.testing.assert_close(
                values[:, :, written], _fp8_round_trip(plain.values[0][:, :, written]), rtol=0, atol=1e-6
            )
    assert torch.equal(fp8.end, plain.end) and int(fp8.end[0]) == 21
    for a, b in outs:
        assert (a - b).norm() / a.norm() < 0.08  # e4m3 keeps 3 mantissa bits: a few percent at most
    # A masked row moves nothing: bytes and scales stay.
    before = (fp8.keys.clone(), fp8.key_scales.clone())
    with torch.no_grad():
        model(x[:, :1], fp8, exec_mask=torch.tensor([False, True]))
    assert torch.equal(fp8.keys[:, 0], before[0][:, 0]) and torch.equal(fp8.key_scales[:, 0], before[1][:, 0])


@pytest.fixture(scope="module")
def quantized_model(tiny_model):
    return load_model("tiny", precision=INT8_FP8)


def test_quantized_load_halves_the_lm_and_keeps_the_rest(tiny_model, quantized_model):
    def nbytes(module):
        return sum(t.numel() * t.element_size() for t in module.state_dict().values())

    assert quantized_model.lm.precision == INT8_FP8
    layer = quantized_model.lm.transformer.layers[0]
    assert layer.self_attn.in_proj_weight.dtype == torch.int8 and layer.self_attn.in_proj_scale is not None
    assert isinstance(quantized_model.lm.depformer.layers[0].self_attn.out_proj, _quant.Int8Linear)
    assert quantized_model.lm.text_linear.weight.dtype == torch.float32  # heads, embeddings: as they were
    assert nbytes(quantized_model.mimi) == nbytes(tiny_model.mimi)
    # Float32 on the CPU: the quantized projections are a quarter, the whole LM a bit over half.
    assert 0.4 < nbytes(quantized_model.lm) / nbytes(tiny_model.lm) < 0.6
    assert isinstance(LMGen(quantized_model.lm, 1).state, Fp8TransformerState)


def _run(engine: PersonaPlexEngine, slot: int, conversation: Conversation, ticks: int) -> list[np.ndarray]:
    steps = engine.start(slot, conversation)
    engine.prefill({slot: steps})
    audio = (0.1 * np.random.RandomState(7).randn(engine.num_slots, 1920)).astype(np.float32)
    modes = [SlotMode.LIVE if i == slot else SlotMode.IDLE for i in range(engine.num_slots)]
    out = []
    for _ in range(ticks):
        engine.step(modes, audio)
        out.append(engine.last_tokens[slot].copy())
    return out


def test_a_reused_slot_replays_its_prompt_as_a_fresh_engine_does(quantized_model):
    """Reset and prompt replay with int8 weights and fp8 rings: nothing of the previous conversation stays."""
    second = Conversation(persona="Another one.", voice="NATM0.pt", sampling=Sampling(text_seed=3, audio_seed=4))
    reused = PersonaPlexEngine(quantized_model, 2)
    _run(reused, 0, Conversation(persona="First.", voice="NATF1.pt", sampling=Sampling(text_seed=1, audio_seed=2)), 70)
    again = _run(reused, 0, second, 20)
    fresh = _run(PersonaPlexEngine(quantized_model, 2), 0, second, 20)
    np.testing.assert_array_equal(np.array(again), np.array(fresh))


def test_quantize_writes_a_folder_that_loads_without_the_original(tmp_path, quantized_model):
    out = tmp_path / "tiny-int8"
    lm_file = write_quantized("tiny", out)
    original = resolve_checkpoint("tiny").lm
    assert lm_file.stat().st_size < 0.6 * original.stat().st_size
    tensors = dict(read_safetensors(lm_file))
    assert tensors["transformer.layers.0.self_attn.in_proj_weight"].dtype == torch.int8
    assert "transformer.layers.0.self_attn.in_proj_scale" in tensors
    loaded = load_model(str(out), precision=Precision(kv_cache=KVFormat.FP8))  # int8 because the file is
    assert loaded.lm.precision == INT8_FP8
    for (name, a), b in zip(loaded.lm.state_dict().items(), quantized_model.lm.state_dict().values()):
        assert torch.equal(a, b), name
    conversation = Conversation(persona="Hello.", sampling=Sampling(text_seed=5, audio_seed=6))
    np.testing.assert_array_equal(
        np.array(_run(PersonaPlexEngine(loaded, 1), 0, conversation, 10)),
        np.array(_run(PersonaPlexEngine(quantized_model, 1), 0, conversation, 10)),
    )


def test_offline_takes_both_options(golden_dir, tmp_path, caplog):
    wav, text = tmp_path / "out.wav", tmp_path / "out.json"
    with caplog.at_level(logging.INFO):
        assert (
            main(
                [
                    "offline",
                    "--model",
                    "tiny",
                    "--input-wav",
                    str(golden_dir / "input.wav"),
                    "--output-wav",
                    str(wav),
                    "--output-text",
                    str(text),
                    "--quantize",
                    "int8",
                    "--kv-cache",
                    "fp8",
                ]
            )
            == 0
        )
    assert "weights int8, KV cache fp8" in caplog.text
    pcm, rate = sphn.read(str(wav))
    source, _ = sphn.read(str(golden_dir / "input.wav"))
    assert rate == 24_000 and pcm.shape[1] == source.shape[1] and np.abs(pcm).max() > 0
    assert len(json.loads(text.read_text())) == -(-source.shape[1] // 1920)


def test_serve_builds_its_engine_with_both_options(tiny_model):
    from pplex_trio._cli import build_parser
    from pplex_trio._cli._engines import create_engine
    from pplex_trio._cli._settings_cli import settings_from_args
    from pplex_trio.server import ServerSettings

    args = build_parser().parse_args(
        ["serve", "--model", "tiny", "--slots", "2", "--quantize", "int8", "--kv-cache", "fp8"]
    )
    engine = create_engine(settings_from_args(ServerSettings, args))
    assert engine.model.lm.precision == INT8_FP8 and engine.num_slots == 2
    assert isinstance(engine._tick.gen.state, Fp8TransformerState)
