"""The engine is ready for its first caller: warm-up and capture at load, fallback, no re-capture.

No GPU here.  The capture's orchestration runs with a fake graph recorder
put where the engine takes its ``CudaGraphs`` from (it records the tick
function and replays it eagerly); what the real
capture needs of the tick (one graph, no breaks, no host reads, static
buffers, rows that a masked tick leaves alone) is checked on the CPU and on
the ``meta`` device at the real 7B widths.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from pplex_trio._precision import KVFormat, Precision, WeightFormat
from pplex_trio.engine import _device_tick, _personaplex
from pplex_trio.engine._device_tick import DeviceTick, TickPath
from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import CONFIGS, LMModel, LoadedModel, Mimi, VoiceLibrary, load_model

IDLE, LIVE = SlotMode.IDLE, SlotMode.LIVE


class FakeGraphs:
    """A graph recorder that replays the recorded function eagerly (or fails to record, or replays it wrong:
    ``corrupt(tick)`` runs after each replay)."""

    def __init__(self, fail: Exception | None = None, corrupt=None):
        self.fail = fail
        self.corrupt = corrupt
        self.recorded = 0
        self.replays = 0

    def record(self, fn, stream):
        self.recorded += 1
        if self.fail is not None:
            raise self.fail
        fn()  # a real capture runs the function once too (its effects are what the replay repeats)

        def replay() -> None:
            self.replays += 1
            fn()
            if self.corrupt is not None:
                self.corrupt(fn.__self__)

        return replay


@pytest.fixture
def fake_graphs(monkeypatch):
    """``fake_graphs(fail=None)``: engines built with ``cuda_graph=True`` from now on record with this fake."""

    def install(fail: Exception | None = None, corrupt=None) -> FakeGraphs:
        graphs = FakeGraphs(fail, corrupt)
        monkeypatch.setattr(_personaplex, "CudaGraphs", lambda device: graphs)
        return graphs

    return install


def _meta_model(cfg, precision: Precision = Precision()) -> LoadedModel:
    with torch.device("meta"):
        lm = LMModel(cfg.lm).to(torch.bfloat16)
        mimi = Mimi(cfg.mimi)
    lm.set_precision(precision)
    return LoadedModel(
        config=cfg, lm=lm, mimi=mimi, tokenizer=None, voices=VoiceLibrary(None), device=torch.device("meta")
    )


def _drive(engine: PersonaPlexEngine, frames: int = 12, seed: int = 0) -> list[np.ndarray]:
    """Two conversations (one sampled, one greedy) through their prompts and ``frames`` live frames."""
    audio = (0.1 * np.random.RandomState(seed).randn(frames, engine.num_slots, 1920)).astype(np.float32)
    engine.prefill(
        {
            0: engine.start(
                0, Conversation(persona="Hi.", voice="NATF1.pt", sampling=Sampling(text_seed=1, audio_seed=2))
            ),
            1: engine.start(1, Conversation(persona="Other.", voice="NATM0.pt", sampling=Sampling(greedy=True))),
        }
    )
    outputs = []
    for frame in audio:
        out = engine.step([LIVE, LIVE] + [IDLE] * (engine.num_slots - 2), frame)
        outputs.append(np.concatenate([engine.last_tokens.ravel().astype(np.float32), out.pcm.ravel()]))
    return outputs


def test_capture_happens_at_load_and_every_tick_replays_it(tiny_model, caplog, fake_graphs):
    graphs = fake_graphs()
    with caplog.at_level(logging.INFO, logger="pplex_trio.engine._device_tick"):
        engine = PersonaPlexEngine(tiny_model, 3, cuda_graph=True)
    checked = _device_tick.CHECK_TICKS
    assert graphs.recorded == 1 and graphs.replays == checked  # before any conversation: only its check
    assert engine.tick_path == "cuda_graph"
    assert any("engine tick ready (3 rows, cuda_graph)" in r.message for r in caplog.records)
    got = _drive(engine)
    assert graphs.replays == checked + len(got) and graphs.recorded == 1  # one replay per tick (prompts: outside)
    want = _drive(PersonaPlexEngine(tiny_model, 3))  # eager, with its shortcuts
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_failed_capture_falls_back_to_eager_once_and_loudly(tiny_model, caplog, fake_graphs):
    graphs = fake_graphs(fail=RuntimeError("operation not permitted when stream is capturing"))
    with caplog.at_level(logging.INFO):
        engine = PersonaPlexEngine(tiny_model, 3, cuda_graph=True)
    assert engine.tick_path == "eager_after_failed_capture"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "CUDA graph capture of the engine tick FAILED" in errors[0].getMessage()
    assert "operation not permitted" in errors[0].getMessage() and errors[0].exc_info is None
    got = _drive(engine)
    assert graphs.recorded == 1  # never tried again
    for a, b in zip(got, _drive(PersonaPlexEngine(tiny_model, 3)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_graph_is_checked_against_eager_ticks_at_load_before_any_conversation(tiny_model, fake_graphs):
    graphs = fake_graphs()
    engine = PersonaPlexEngine(tiny_model, 3, cuda_graph=True)
    assert engine.tick_path == "cuda_graph" and graphs.replays == _device_tick.CHECK_TICKS
    assert not engine._tick.live.any()  # every row left fresh (the comparison with a fresh eager engine: above)


@pytest.mark.parametrize(
    "corrupt, says",
    [
        (lambda tick: tick.packed[:, -5:].add_(0.01), "its PCM differs from the eager tick's by 0.01"),
        (lambda tick: tick.packed[:, 0].add_(1.0), "its tokens differ from the eager tick's"),
        (lambda tick: None, None),
    ],
    ids=["pcm", "tokens", "faithful"],
)
def test_a_graph_whose_replay_differs_from_the_eager_tick_is_not_used(tiny_model, caplog, fake_graphs, corrupt, says):
    graphs = fake_graphs(corrupt=corrupt)
    with caplog.at_level(logging.INFO):
        engine = PersonaPlexEngine(tiny_model, 3, cuda_graph=True)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    if says is None:
        assert engine.tick_path == "cuda_graph" and not errors
        return
    assert engine.tick_path == "eager_after_failed_check"
    assert len(errors) == 1 and errors[0].exc_info is None
    assert "the CUDA graph of the engine tick FAILED its check (tick 1 of 6: " + says in errors[0].getMessage()
    replays = graphs.replays
    got = _drive(engine)
    assert graphs.replays == replays  # never replayed again
    for a, b in zip(got, _drive(PersonaPlexEngine(tiny_model, 3)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_by_default_a_graph_is_recorded_only_on_cuda(tiny_model, fake_graphs):
    graphs = fake_graphs()
    assert PersonaPlexEngine(tiny_model, 2).tick_path == "eager" and graphs.recorded == 0  # (the CPU)
    assert PersonaPlexEngine(tiny_model, 2, cuda_graph=False).tick_path == "eager" and graphs.recorded == 0
    assert PersonaPlexEngine.load("tiny", 1, device="cpu").tick_path == "eager"  # auto: no complaint off CUDA
    assert graphs.recorded == 0  # (cuda_graph=True off CUDA is refused: test_engine_tick.py)


def test_new_voices_and_resets_never_recapture(tiny_model, fake_graphs):
    graphs = fake_graphs()
    engine = PersonaPlexEngine(tiny_model, 2, cuda_graph=True)
    buffers = {name: t.data_ptr() for name, t in vars(engine._tick).items() if isinstance(t, torch.Tensor)}
    silence = np.zeros((2, 1920), np.float32)
    for voice in engine.voices():
        engine.prefill({0: engine.start(0, Conversation(voice=voice))})
        engine.step([LIVE, IDLE], silence)
    engine.reset(0)
    engine.reset_all()
    assert graphs.recorded == 1
    assert {name: t.data_ptr() for name, t in vars(engine._tick).items() if isinstance(t, torch.Tensor)} == buffers


def test_reset_all_is_in_place_and_leaves_fresh_rows(tiny_model):
    engine = PersonaPlexEngine(tiny_model, 3)
    _drive(engine, frames=4)
    before = {name: t.data_ptr() for name, t in vars(engine._tick).items() if isinstance(t, torch.Tensor)}
    engine.reset_all()
    assert {name: t.data_ptr() for name, t in vars(engine._tick).items() if isinstance(t, torch.Tensor)} == before
    for a, b in zip(_drive(engine), _drive(PersonaPlexEngine(tiny_model, 3)), strict=True):
        np.testing.assert_array_equal(a, b)


SCRATCH = ("tick.host_", "tick.live", "tick.pcm", "tick.packed", "tick.gen.depformer_cache")
"""Written by every tick before anything reads them: inputs, outputs, the depformer's keys of one frame."""


def _state(tick: DeviceTick) -> dict[str, torch.Tensor]:
    """Every state tensor of the tick; of the KV rings, the slots attention reads (a ring's spare slot holds
    whatever a masked row last wrote there)."""
    from tests.model.test_engine_tick import tick_tensors

    state = {}
    for name, t in tick_tensors(tick).items():
        if name.endswith(".kv"):
            t = t[..., :-1, :]
        elif name.endswith(".scales"):
            t = t[..., :-1]
        if not name.startswith(SCRATCH):
            state[name] = t.clone()
    return state


def test_warm_up_ticks_mid_conversation_leave_every_row_bit_identical(golden_model):
    """The golden model's ring (64 positions) wraps inside its prompt: warm-ups before and after the wrap,
    in the middle of a prompt and between live ticks."""
    plain, warmed = PersonaPlexEngine(golden_model, 3), PersonaPlexEngine(golden_model, 3)
    audio = (0.1 * np.random.RandomState(3).randn(3, 1920)).astype(np.float32)
    for e in (plain, warmed):
        e.start(0, Conversation(persona="A teacher.", voice="TINY0.pt", sampling=Sampling(text_seed=7, audio_seed=8)))
        e.start(2, Conversation(persona="A teacher.", voice="TINY0.pt", sampling=Sampling(text_seed=4, audio_seed=5)))
    wraps = golden_model.config.lm.context
    for tick in range(wraps + 40):
        live = [plain.prompt_left(i) == 0 and i != 1 for i in range(3)]
        modes = [LIVE if is_live else IDLE for is_live in live]
        for e in (plain, warmed):
            e.prefill({i: 1 for i in (0, 2) if e.prompt_left(i)})
        outs = [e.step(modes, audio) for e in (plain, warmed)]
        np.testing.assert_array_equal(outs[0].pcm, outs[1].pcm)
        np.testing.assert_array_equal(plain.last_tokens, warmed.last_tokens)
        if tick in (3, wraps + 2, wraps + 30):  # mid-voice, after the ring wrapped, live
            warmed._tick.prepare()
            a, b = _state(plain._tick), _state(warmed._tick)
            assert a.keys() == b.keys()
            for name in a:
                assert torch.equal(a[name], b[name]), (tick, name)
    assert plain._tick.gen.state.end[0] > wraps and live == [True, False, True]


@pytest.mark.parametrize("precision", [Precision(), Precision(WeightFormat.INT8, KVFormat.FP8)], ids=str)
def test_tick_traces_as_one_graph_at_real_widths(precision):
    """What torch.compile or a capture needs: one graph, no breaks (7B widths, two layers, on meta)."""
    cfg = CONFIGS["personaplex-7b-v1"]
    cfg = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, num_layers=2, depformer_num_layers=2))
    tick = DeviceTick(_meta_model(cfg, precision), 2)
    explained = torch._dynamo.explain(tick.run)()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_7b_shapes_run_one_tick_of_64_rows_on_meta():
    tick = DeviceTick(_meta_model(CONFIGS["personaplex-7b-v1"]), 64)
    tick.prepare()  # the warm-up: two masked ticks
    tick.run()
    assert tick.gen.state.keys.shape == (32, 64, 32, 3000, 128) and tick.gen.state.keys.dtype == torch.bfloat16
    assert tick.packed.shape == (64, 17 + 1 + 1920)
    assert tick.path is TickPath.EAGER


def test_the_engine_runs_in_bfloat16_on_the_cpu(tiny_model):
    model = load_model("tiny", dtype=torch.bfloat16)
    assert model.lm.dtype == torch.bfloat16 and model.mimi.decoder.model[0].conv.conv.weight.dtype == torch.float32
    engine = PersonaPlexEngine(model, 2)
    outputs = _drive(engine, frames=8)
    cfg = model.config.lm
    for out in outputs:
        tokens = out[: 2 * cfg.num_streams].reshape(2, -1)
        assert ((tokens[:, 1:] >= 0) & (tokens[:, 1:] < cfg.card)).all()
        assert np.isfinite(out).all()
    assert np.abs(outputs[-1][2 * cfg.num_streams :]).max() > 0  # it speaks
