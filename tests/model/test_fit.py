"""Memory that sizes itself: `pplex-trio fit`, `serve --slots auto`, and one line when memory runs out."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from pplex_trio._cli import main
from pplex_trio._cli._engines import create_engine
from pplex_trio.engine._fit import GIB, peak_bytes, plan_memory
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import CONFIGS, LMModel
from pplex_trio.server import ServerSettings
from tests.model.test_engine_tick import tick_tensors


def _distinct_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def _engine_state_bytes(engine: PersonaPlexEngine) -> int:
    """Every tensor the engine's tick holds, found by walking it (host staging buffers aside)."""
    return _distinct_bytes(t for name, t in tick_tensors(engine._tick).items() if not name.startswith("tick.host_"))


def test_the_plan_matches_what_the_engine_allocates(tiny_model):
    plan = plan_memory(CONFIGS["tiny"], torch.float32)
    real_weights = _distinct_bytes(
        [
            *tiny_model.lm.parameters(),
            *tiny_model.lm.buffers(),
            *tiny_model.mimi.parameters(),
            *tiny_model.mimi.buffers(),
        ]
    )
    assert plan.weights == real_weights
    state_per_row = plan.per_conversation - plan.parts["tick_temporaries"]
    three, five = (_engine_state_bytes(PersonaPlexEngine(tiny_model, n)) for n in (3, 5))
    assert five - three == 2 * state_per_row
    # layers x (K, V) x (context + the spare slot) x dim x float32, and the row's position
    assert plan.parts["lm_kv_ring"] == 2 * 2 * 3001 * 64 * 4 + 8


def test_the_7b_plan_is_what_the_model_card_says():
    plan = plan_memory(CONFIGS["personaplex-7b-v1"], torch.bfloat16)
    assert plan.parts["lm_kv_ring"] == 32 * 2 * 3001 * 4096 * 2 + 8  # 1.465 GiB (3000 positions, a spare slot)
    assert 15.5 * GIB < plan.weights < 16.5 * GIB  # 8.37 B parameters in bf16, Mimi in float32
    assert 1.46 * GIB < plan.per_conversation < 1.5 * GIB
    assert plan.conversations(141 * GIB, 2 * GIB) == int(
        (139 * GIB - plan.weights - plan.fixed) // plan.per_conversation
    )
    assert plan.conversations(16 * GIB) == 0


def test_peak_bytes_follows_allocations_not_views_or_in_place_ops():
    base = torch.zeros(1000)  # before: not counted

    def work() -> None:
        a = torch.ones(1000)  # 4000
        b = a * 2  # 8000 live
        base.add_(b)  # in place: nothing new
        view = b.view(10, 100)  # a view: nothing new
        del a, b
        c = view + 1  # 8000 live again
        del view, c
        d = torch.empty(500, dtype=torch.float64)  # 4000
        del d

    assert peak_bytes(work, torch.device("cpu")) == 8000


@pytest.mark.parametrize("memory", ["141GiB", "80GiB", "48GiB", "24GiB", "16GiB"])
def test_fit_prints_the_figures(memory, capsys):
    assert main(["fit", "--model", "personaplex-7b-v1", "--gpu-memory", memory]) == 0
    text = capsys.readouterr().out
    plan = plan_memory(CONFIGS["personaplex-7b-v1"], torch.bfloat16)
    count = plan.conversations(int(float(memory.removesuffix("GiB")) * GIB), 2 * GIB)
    assert f"conversations that fit: {count}" in text
    assert "per conversation           1.483 GiB" in text and "lm_kv_ring" in text
    assert main(["fit", "--model", "personaplex-7b-v1", "--gpu-memory", memory, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["conversations"] == count and figures["gpu_memory_gib"] == float(memory.removesuffix("GiB"))
    assert {"weights_gib", "fixed_gib", "per_conversation_gib", "gpu_memory_gib", "conversations"} <= set(figures)


def test_int8_weights_and_an_fp8_cache_fit_a_16_gib_card(capsys):
    cfg = CONFIGS["personaplex-7b-v1"]
    full = plan_memory(cfg, torch.bfloat16)
    with torch.device("meta"):
        lm = LMModel(cfg.lm)
    # Every matrix of the two transformers' layers becomes one byte per weight plus a bf16 scale per row.
    matrices = [
        p
        for name, p in lm.named_parameters()
        if name.startswith(("transformer.layers.", "depformer.layers.")) and p.dim() == 2
    ]
    saved = sum(p.numel() * 2 - (p.numel() + 2 * p.shape[0]) for p in matrices)
    assert main(["fit", "--model", "personaplex-7b-v1", "--gpu-memory", "16GiB", "--quantize", "int8", "--json"]) == 0
    int8 = json.loads(capsys.readouterr().out)
    assert int8["weights_gib"] * GIB == full.weights - saved
    assert 0.5 < int8["weights_gib"] * GIB / full.weights < 0.6
    assert int8["conversations"] >= 1 and int8["quantize"] == "int8"
    assert (
        main(
            [
                "fit",
                "--model",
                "personaplex-7b-v1",
                "--gpu-memory",
                "16GiB",
                "--quantize",
                "int8",
                "--kv-cache",
                "fp8",
                "--json",
            ]
        )
        == 0
    )
    both = json.loads(capsys.readouterr().out)
    fp8_ring = 32 * 2 * 3001 * 4096 * 1 + 32 * 2 * 3001 * 32 * 4 + 8  # bytes, and a float32 scale per head
    assert both["per_conversation_parts_gib"]["lm_kv_ring"] * GIB == fp8_ring
    assert both["per_conversation_gib"] < 0.56 * int8["per_conversation_gib"]
    assert both["conversations"] > int8["conversations"]


def test_fit_lists_every_choice_when_asked(capsys):
    assert (
        main(
            [
                "fit",
                "--model",
                "tiny",
                "--dtype",
                "float32",
                "--gpu-memory",
                "0.05GiB",
                "--kv-cache",
                "fp8",
                "--gpu-memory-reserve",
                "0",
                "--every-choice",
                "--json",
            ]
        )
        == 0
    )
    figures = json.loads(capsys.readouterr().out)
    choices = {(c["quantize"], c["kv_cache"]): c for c in figures["choices"]}
    assert set(choices) == {("none", "model"), ("none", "fp8"), ("int8", "model"), ("int8", "fp8")}
    assert [key for key, c in choices.items() if c["chosen"]] == [("none", "fp8")]
    assert choices["int8", "fp8"]["weights_gib"] < 0.7 * choices["none", "fp8"]["weights_gib"]
    ring = {key: c["per_conversation_parts_gib"]["lm_kv_ring"] for key, c in choices.items()}
    # float32 on the CPU: a quarter, and a float32 scale per 16-wide head
    assert ring["int8", "fp8"] == ring["none", "fp8"] < 0.32 * ring["none", "model"]


def test_fit_without_a_gpu_asks_for_the_memory(caplog):
    assert main(["fit", "--model", "tiny"]) == 2
    assert "pass --gpu-memory" in caplog.text
    assert main(["fit", "--model", "no-such-model"]) == 2


def test_serve_slots_auto_takes_the_count_fit_gives(tiny_model, monkeypatch, capsys, caplog):
    """A fake device with known memory: the slots `serve` picks are the conversations `fit` prints."""
    total = 0.25 * GIB
    plan = plan_memory(CONFIGS["tiny"], torch.float32)
    monkeypatch.setattr("pplex_trio.engine._fit.free_device_memory", lambda device: int(total) - plan.weights)
    assert (
        main(
            [
                "fit",
                "--model",
                "tiny",
                "--dtype",
                "float32",
                "--gpu-memory",
                "0.25GiB",
                "--gpu-memory-reserve",
                "0.1GiB",
                "--json",
            ]
        )
        == 0
    )
    expected = json.loads(capsys.readouterr().out)["conversations"]
    assert 10 < expected < 100
    with caplog.at_level(logging.INFO):
        engine = create_engine(ServerSettings(model="tiny", slots="auto", gpu_memory_reserve_gib=0.1))
    assert engine.num_slots == expected
    assert f"--slots auto: {expected} conversations fit" in caplog.text


def test_out_of_memory_at_start_is_one_clear_line(tiny_model, monkeypatch, caplog):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.46 GiB")

    monkeypatch.setattr(PersonaPlexEngine, "__init__", out_of_memory)
    assert main(["serve", "--model", "tiny", "--slots", "500", "--port", "0"]) == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    message = errors[0].getMessage()
    assert message.startswith("--model tiny: out of memory while building the engine for 500 conversations on cpu")
    assert "tiny needs 0.0 GiB of weights (float32)" in message
    assert "use --quantize int8 and --kv-cache fp8, or a device with more memory" in message
    assert "Traceback" not in caplog.text


def test_slots_flag_takes_auto_or_a_number(capsys):
    assert ServerSettings(slots="auto").slots is None and ServerSettings(slots="7").slots == 7
    assert ServerSettings().slots is None and ServerSettings().gpu_memory_reserve == 2 * GIB
    with pytest.raises(SystemExit):
        main(["serve", "--slots", "many"])
    assert "'many' is neither a whole number nor auto" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--gpu-memory-reserve", "lots"])
    assert "is not a memory size" in capsys.readouterr().err
    np.testing.assert_allclose(ServerSettings(gpu_memory_reserve_gib=1.5).gpu_memory_reserve, 1.5 * GIB)
