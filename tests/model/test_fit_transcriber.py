"""A transcriber's memory beside the model: its plan from its config, --transcribe auto's room, --slots auto."""

from __future__ import annotations

import logging

import pytest
import torch

from pplex_trio.engine import _fit, _fit_transcriber
from pplex_trio.engine._fit import GIB, auto_slots, plan_memory
from pplex_trio.engine._fit_transcriber import plan_transcriber_memory, transcriber_for
from pplex_trio.model import STTConfig, load_stt_config

MIB = 2**20


def test_the_plan_is_the_config_s_weights_and_kv_rings():
    # Kyutai's 1B layout: 16 layers, dim 2048, a 750-frame context; keys and values in bfloat16.
    plan = plan_transcriber_memory(STTConfig(name="1b-layout", extra_heads_num_heads=4))
    assert 1.7 * GIB < plan.weights < 1.9 * GIB
    kv = 16 * 750 * 2048 * 2 * 2
    assert kv <= plan.per_conversation < kv + 2 * MIB  # the rings, the token cache, a step's temporaries


def test_tiny_stt_config_is_read_without_its_weights(_private_cache):
    cfg = load_stt_config("tiny-stt")
    assert cfg.n_q == 32 and cfg.card == 64 and cfg.has_end_of_turn


def test_auto_leaves_it_out_when_the_gpu_has_no_room(tiny_model, monkeypatch, caplog):
    plan = plan_transcriber_memory(load_stt_config("tiny-stt"), torch.float32)
    ours = plan_memory(tiny_model.config, tiny_model.lm.dtype)
    need = plan.weights + plan.per_conversation + ours.fixed + ours.per_conversation + GIB
    monkeypatch.setattr(_fit_transcriber, "free_device_memory", lambda device: need - 1)
    with caplog.at_level(logging.WARNING):
        assert transcriber_for("tiny-stt", tiny_model, required=False, reserve=GIB) == (None, 0)
    assert any("--transcribe auto: no room for tiny-stt" in r.message for r in caplog.records)
    monkeypatch.setattr(_fit_transcriber, "free_device_memory", lambda device: need)
    loaded, extra = transcriber_for("tiny-stt", tiny_model, required=False, reserve=GIB)
    assert loaded is not None and extra == plan.per_conversation
    # Asked for by name, it is loaded whatever the plan says (the load itself fails when it does not fit).
    monkeypatch.setattr(_fit_transcriber, "free_device_memory", lambda device: 0)
    assert transcriber_for("tiny-stt", tiny_model, required=True, reserve=GIB)[0] is not None


def test_slots_auto_counts_the_transcriber_s_rows(tiny_model, monkeypatch):
    ours = plan_memory(tiny_model.config, tiny_model.lm.dtype)
    free = ours.fixed + 10 * ours.per_conversation
    monkeypatch.setattr(_fit, "free_device_memory", lambda device: free)
    assert auto_slots(tiny_model, 0) == 10
    assert auto_slots(tiny_model, 0, extra=ours.per_conversation) == 5
    with pytest.raises(_fit.NotEnoughMemory):
        auto_slots(tiny_model, 0, extra=10 * ours.per_conversation)


def test_fit_shows_the_conversations_with_the_transcriber_and_without(tmp_path, capsys):
    import json

    from pplex_trio._cli import main
    from pplex_trio.model._stt_config import stt_config_to_dict

    folder = tmp_path / "stt-1b-layout"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(stt_config_to_dict(STTConfig(name="x", extra_heads_num_heads=4))))
    args = ["fit", "--model", "personaplex-7b-v1", "--gpu-memory", "80GiB", "--transcribe", str(folder)]
    assert main([*args, "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    alone, beside = figures["conversations"], figures["transcriber"]["conversations"]
    assert figures["transcriber"]["model"] == "stt-1b-layout" and 0 < beside < alone  # 41 alone on 80 GiB
    assert main(args) == 0
    assert f"conversations that fit: {alone}\n  with the transcriber stt-1b-layout (1.84 GiB of weights" in (
        capsys.readouterr().out
    )
