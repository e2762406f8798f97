"""``PersonaPlexEngine(compile=True)``: the tick through ``torch.compile``, checked against eager ticks at load.

The wiring is tested with ``torch.compile`` replaced by a stand-in (exact, or
one that corrupts a token).  The real compile (inductor on this CPU, the golden
checkpoint: one to three minutes of CPU, which a busy machine stretches past any
test's patience) is ``bench/compile_cpu.py``: how often its tokens agree with the
eager tick's, and that the check at load tells the two apart (docs/BENCHMARKS.md,
*Kernels per tick*: inexact on the CPU).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from _helpers.engine_runs import drive
from pplex_trio.engine import _personaplex
from pplex_trio.engine._personaplex import PersonaPlexEngine


@pytest.fixture
def fake_compile(monkeypatch):
    """``torch.compile`` replaced: the function itself, or (``corrupt``) one whose output has a token moved."""

    def install(corrupt: bool = False) -> list[dict]:
        calls: list[dict] = []

        def compile(fn, **options):
            calls.append(options)
            if not corrupt:
                return fn

            def wrong() -> None:
                fn()
                fn.__self__.packed[:, 1].add_(1.0)

            return wrong

        monkeypatch.setattr(torch, "compile", compile)
        return calls

    return install


def test_a_compiled_tick_that_agrees_is_used_for_every_tick(tiny_model, fake_compile, caplog):
    calls = fake_compile()
    with caplog.at_level(logging.INFO, logger="pplex_trio.engine._device_tick"):
        engine = PersonaPlexEngine(tiny_model, 2, compile=True)
    assert calls == [{"fullgraph": True, "dynamic": False}]
    assert engine.tick_path == "compiled"
    assert any(
        "engine tick ready (2 rows, compiled) after torch.compile and its check" in r.message for r in caplog.records
    )
    got, want = drive(engine), drive(PersonaPlexEngine(tiny_model, 2))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


class _Recorder:
    """A graph recorder whose "replay" runs the recorded function again (what a capture would repeat)."""

    def __init__(self) -> None:
        self.recorded: list = []

    def record(self, fn, stream):
        self.recorded.append(fn)
        fn()
        return fn


def test_a_compiled_tick_is_what_the_cuda_graph_records(tiny_model, fake_compile, monkeypatch):
    fake_compile()
    recorder = _Recorder()
    monkeypatch.setattr(_personaplex, "CudaGraphs", lambda device: recorder)
    engine = PersonaPlexEngine(tiny_model, 2, compile=True, cuda_graph=True)
    assert engine.tick_path == "compiled_cuda_graph" and recorder.recorded == [engine._tick.run]


def test_a_compiled_tick_whose_tokens_differ_is_dropped_loudly(tiny_model, fake_compile, caplog):
    fake_compile(corrupt=True)
    with caplog.at_level(logging.INFO):
        engine = PersonaPlexEngine(tiny_model, 2, compile=True)
    assert engine.tick_path == "eager_after_failed_check"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (
        len(errors) == 1
        and "torch.compile of the engine tick FAILED (tick 1 of 6: its tokens differ" in errors[0].getMessage()
    )
    got, want = drive(engine), drive(PersonaPlexEngine(tiny_model, 2))
    np.testing.assert_array_equal(got[0], want[0])  # eager, every row fresh after the check
