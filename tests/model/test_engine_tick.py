"""The engine tick's device side: static buffers, one read back, what a CUDA graph needs.

No GPU here: these tests check on CPU the properties the ``cuda_graph``
path relies on (every tensor a tick touches is allocated once, the tick's
device work reads nothing back and is a function of its buffers, the
version with every part on gives the same results) and the host<->device
traffic of a tick (uploads first, one read back).  ``test_engine_ready.py``
checks the capture's orchestration with a fake graph; the capture and
replay themselves run on a GPU only (``bench/gpu/run``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from _model_flows import every_part
from torch.overrides import TorchFunctionMode

from pplex_trio._precision import KVFormat, Precision, WeightFormat
from pplex_trio.engine._device_tick import DeviceTick
from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import load_model

IDLE, LIVE = SlotMode.IDLE, SlotMode.LIVE


def tick_tensors(obj, path: str = "tick", seen: set[int] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor reachable from ``obj`` (attributes, dataclass fields, lists), model weights excluded."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (torch.nn.Module, torch.Generator, str, int, float, bool, type(None))):
        return {}
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            out.update(tick_tensors(item, f"{path}[{i}]", seen))
    elif hasattr(obj, "__dict__"):
        for name, value in vars(obj).items():
            if name != "model":  # the LoadedModel: weights, tokenizer, voice files
                out.update(tick_tensors(value, f"{path}.{name}", seen))
    return out


def layout(tensors: dict[str, torch.Tensor]) -> dict[str, tuple]:
    return {name: (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for name, t in tensors.items()}


@pytest.fixture(scope="module")
def quantized_model(tiny_model):
    return load_model("tiny", precision=Precision(WeightFormat.INT8, KVFormat.FP8))


@pytest.fixture(params=["full precision", "int8 + fp8"])
def any_model(request, tiny_model):
    """The tiny model as loaded, and with ``--quantize int8 --kv-cache fp8``."""
    return tiny_model if request.param == "full precision" else request.getfixturevalue("quantized_model")


@pytest.fixture
def busy_engine(any_model) -> PersonaPlexEngine:
    """Three rows mid-way: 0 LIVE and sampling, 1 inside its voice prompt (IDLE in ticks), 2 IDLE."""
    engine = PersonaPlexEngine(any_model, 3)
    steps = engine.start(0, Conversation(persona="Hi.", voice="NATF1.pt", sampling=Sampling(text_seed=1, audio_seed=2)))
    audio = (0.1 * np.random.RandomState(0).randn(3, 1920)).astype(np.float32)
    engine.prefill({0: steps})
    engine.start(1, Conversation(persona="Other.", voice="NATM0.pt", sampling=Sampling(greedy=True)))
    for _ in range(3):
        engine.prefill({1: 2})
        engine.step([LIVE, IDLE, IDLE], audio)
    engine._tick.host_live[:] = torch.tensor([1, 0, 0])
    engine._tick.upload()
    return engine


def test_cuda_graph_is_refused_off_cuda(tiny_model):
    with pytest.raises(ValueError, match="cuda_graph=True needs the model on a CUDA device, not cpu"):
        PersonaPlexEngine(tiny_model, 1, cuda_graph=True)
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        PersonaPlexEngine.load("no/such-model", 1, device="cpu", cuda_graph=True)  # refused before loading


def test_no_tensor_is_reallocated_between_ticks(any_model):
    engine = PersonaPlexEngine(any_model, 3)
    audio = (0.1 * np.random.RandomState(1).randn(3, 1920)).astype(np.float32)
    left = [engine.start(0, Conversation(voice="NATF0.pt")), engine.start(1, Conversation(voice="NATF1.pt")), None]
    before = layout(tick_tensors(engine._tick))
    assert len(before) > 50 and {"tick.packed", "tick.gen.state.kv", "tick.encoder.transformer.kv"} <= set(before)
    for tick in range(60):
        if tick == 30:  # a row (re)starts mid-way: reset and a new voice, in place
            left[2] = engine.start(2, Conversation(voice="NATM0.pt", sampling=Sampling(text_seed=5, audio_seed=6)))
        every_part(engine, on=tick % 2 == 1)  # eager ticks with and without the parts they skip
        work = {i: 2 for i, n in enumerate(left) if n}
        for i, done in (engine.prefill(work) if work else {}).items():
            left[i] -= done
        modes = [LIVE if n == 0 else IDLE for n in left]
        engine.step(modes, audio)
        assert layout(tick_tensors(engine._tick)) == before, f"tick {tick}"
    assert modes == [LIVE, LIVE, LIVE]  # the third went live mid-way


def test_tick_is_a_function_of_its_buffers(busy_engine):
    """Same buffers in, same buffers out: nothing of a tick lives outside them (no Python-side state)."""
    tick = busy_engine._tick
    tensors = tick_tensors(tick)
    snapshot = {name: t.clone() for name, t in tensors.items()}
    tick.run()
    first = {name: t.clone() for name, t in tensors.items()}
    assert not torch.equal(first["tick.gen.cache.offset"], snapshot["tick.gen.cache.offset"])  # it did advance
    for name, t in tensors.items():
        t.copy_(snapshot[name])
    tick.run()
    for name, t in tensors.items():
        assert torch.equal(t, first[name]), name


class HostTraffic(TorchFunctionMode):
    """Records torch calls: which touch the host staging buffers, and any read of a tensor's values on the host."""

    READS = {
        "item",
        "tolist",
        "numpy",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "cpu",
        "nonzero",
        "masked_select",
        "unique",
        "tensor",
        "as_tensor",
        "bool-mask indexing",
    }
    METADATA = {"__get__", "_set_grad_enabled", "size", "dim", "stride", "numel", "data_ptr", "is_contiguous"}

    def __init__(self, staging: dict[str, torch.Tensor]):
        super().__init__()
        self.staging = {t.data_ptr(): name for name, t in staging.items()}
        self.events: list[tuple[str, list[str]]] = []  # (function, staging buffers among its tensor arguments)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        name = getattr(func, "__name__", str(func))
        if name == "__getitem__" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in (args[1] if isinstance(args[1], tuple) else (args[1],))
        ):
            name = "bool-mask indexing"  # a hidden nonzero(): a host sync on CUDA
        if name not in self.METADATA:
            self.events.append((name, [self.staging.get(t.data_ptr(), "") for t in tensors]))
        return func(*args, **kwargs)


def staging_of(tick: DeviceTick) -> dict[str, torch.Tensor]:
    return {"host_live": tick.host_live, "host_pcm": tick.host_pcm, "host_packed": tick.host_packed}


def test_tick_reads_nothing_back(busy_engine):
    """What the CUDA graph records: no host read, no host data turned into a tensor, no host buffer touched."""
    tick = busy_engine._tick
    with HostTraffic(staging_of(tick)) as traffic:
        tick.run()
    assert len(traffic.events) > 200
    assert [name for name, _ in traffic.events if name in HostTraffic.READS] == []
    assert [e for e in traffic.events if any(e[1])] == []


def test_step_uploads_first_and_reads_back_once(busy_engine):
    tick = busy_engine._tick
    audio = (0.1 * np.random.RandomState(2).randn(3, 1920)).astype(np.float32)
    with HostTraffic(staging_of(tick)) as traffic:
        busy_engine.step([LIVE, IDLE, IDLE], audio)
    events = traffic.events
    uploads = [i for i, (name, bufs) in enumerate(events) if name == "copy_" and bufs[0] == "" and bufs[1]]
    downloads = [i for i, (name, bufs) in enumerate(events) if name == "copy_" and bufs[0] and not bufs[1]]
    assert [events[i][1][1] for i in uploads] == ["host_live", "host_pcm"]
    assert [events[i][1][0] for i in downloads] == ["host_packed"]
    # Before the uploads only the staging buffers are touched (filled through numpy views)...
    assert all(bufs and all(bufs) for _, bufs in events[: uploads[0]])
    # ...and reads of values happen only there, from the staging buffers.
    reads = [(name, bufs) for name, bufs in events if name in HostTraffic.READS]
    assert reads and all(name == "numpy" and all(bufs) for name, bufs in reads), reads
    assert downloads[0] > max(i for i, (_, bufs) in enumerate(events) if not any(bufs))  # the last device op


def test_packed_read_back_is_exact(tiny_model):
    tick = DeviceTick(tiny_model, 2)
    k = tiny_model.config.lm.num_streams
    tokens = torch.tensor([[-2] * k, [2**24 - 1, 31_999, 2048, 3, 0] + [-1] * (k - 5)])
    tick.packed[:, :k].copy_(tokens)
    tick.packed[:, k].copy_(torch.tensor([False, True]))
    tick.packed[:, k + 1 :] = torch.linspace(-1, 1, 2 * 1920).view(2, 1920)
    got_tokens, valid, pcm = tick.unpack(tick.download())
    np.testing.assert_array_equal(got_tokens, tokens.numpy())
    assert got_tokens.dtype == np.int64 and valid.tolist() == [False, True]
    np.testing.assert_array_equal(pcm, tick.packed[:, k + 1 :].numpy())
    lm = dataclasses.replace(tiny_model.config.lm, text_card=2**24)
    with pytest.raises(ValueError, match="float32 read-back"):
        DeviceTick(dataclasses.replace(tiny_model, config=dataclasses.replace(tiny_model.config, lm=lm)), 1)
