"""One engine tick on the device: static buffers in, one packed buffer out, optionally a CUDA graph.

:meth:`DeviceTick.run` is all the device work of a tick: Mimi encode of the
LIVE rows, one LM step (temporal transformer, sampling noise, text
sampling, depformer), Mimi decode of the frames that exist.  It reads only
preallocated buffers (the control and PCM inputs, the sampling settings and
seeds, the voice prompts) and the streaming states, and it writes only the
states (in place) and one preallocated output buffer.  No host sync, no
Python branch on a device value, no tensor that outlives the call is
allocated.  That is what lets a CUDA graph record it once, **at load**
(:meth:`DeviceTick.prepare`), and replay it every tick.

Host <-> device traffic per tick:

* before any kernel, two host->device copies from staging buffers (pinned
  on CUDA): ``control`` (int64 ``[B, K + 5]``: the forced tokens, then the
  voice-prompt step and four row flags, see :data:`VOICE_STEP` ...) and,
  when a row is LIVE, ``pcm`` (float32 ``[B, frame]``);
* after the work, **one** device->host copy of ``packed`` (float32
  ``[B, K + 1 + frame]``: the de-delayed tokens, exact in float32 as every
  id is below 2**24, the valid flag, the output PCM), which on CUDA is the
  tick's only sync.

Rows that do not execute keep their state bit for bit (the model package's
rule), so the graph serves every mix of IDLE, PREFILL and LIVE rows, and a
warm-up tick with every row masked out disturbs no conversation.

On CUDA every call runs under :meth:`DeviceTick.on_device`: the engine's own
device (whatever the calling worker thread's current device is) and its own
stream, and attention kernels that never fall back to the math kernel (which
would upcast the bf16 KV ring to fp32 on every step).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np
import torch

from ..model import LMGen, LoadedModel, RowNoise, RowSampling, StepInputs, VoicePrompt

logger = logging.getLogger(__name__)

# Columns of ``control`` after the K forced tokens.
VOICE_STEP, LIVE, EXEC, EMBED, RESTORE = range(5)
CONTROL_EXTRA = 5

FLOAT32_EXACT = 2**24
"""Integers below this are exact in float32: every token id must be (checked at construction)."""

VOICE_CAPACITY_STEPS = 250
"""Voice-prompt steps every row can hold (20 s), at least: the buffer is sized once, at load."""


class TickPath(enum.StrEnum):
    """How the engine runs its ticks (``/health`` shows it)."""

    EAGER = "eager"
    CUDA_GRAPH = "cuda_graph"
    EAGER_AFTER_FAILED_CAPTURE = "eager_after_failed_capture"  # asked for a graph; its capture failed


class GraphRecorder(Protocol):
    """Records a function once and returns what replays it (CUDA graphs; tests pass a fake)."""

    def record(self, fn: Callable[[], None], stream: torch.cuda.Stream | None) -> Callable[[], None]: ...


class CudaGraphs:
    """:class:`GraphRecorder` of ``torch.cuda.graph``, capturing on the engine's own stream."""

    def __init__(self, device: torch.device):
        if device.type != "cuda" or not torch.cuda.is_available():
            raise ValueError(f"cuda_graph=True needs the model on a CUDA device, not {device} "
                             f"(CUDA available here: {torch.cuda.is_available()}): use device='cuda' "
                             "or leave cuda_graph off")
        self.graph: torch.cuda.CUDAGraph | None = None

    def record(self, fn: Callable[[], None], stream: torch.cuda.Stream | None) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        self.graph = graph
        return graph.replay


def attention_kernels() -> contextlib.AbstractContextManager[None]:
    """On CUDA: SDPA may pick flash, memory-efficient or cuDNN attention, never the math kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION])


class DeviceTick:
    """The device half of a :class:`~pplex_trio.engine._personaplex.PersonaPlexEngine`.

    Owns every tensor a tick touches, allocated once for ``batch_size``
    rows: the LM and Mimi streaming states, per-row sampling settings and
    seeds, the voice prompts of the rows (``voice_steps`` steps each, at
    least :data:`VOICE_CAPACITY_STEPS`), the input/output buffers and their
    host staging copies.  The engine fills ``host_control`` / ``host_pcm``,
    calls :meth:`upload`, :meth:`run` or :meth:`replay`, then :meth:`download`.

    Call :meth:`prepare` once before the first tick: it warms up and, given
    a :class:`GraphRecorder`, records the tick (``path`` says what runs).
    """

    def __init__(self, model: LoadedModel, batch_size: int, *, depformer_steps: int | None = None,
                 voice_steps: int = 0):
        cfg = model.config.lm
        if max(cfg.text_card, cfg.card) + 1 >= FLOAT32_EXACT:
            raise ValueError(f"vocabularies of {cfg.text_card} / {cfg.card} tokens do not fit the float32 read-back")
        self.model = model
        self.cfg = cfg
        self.device = dev = model.device
        self.batch_size = b = batch_size
        self.num_streams = k = cfg.num_streams
        self.first_user = 1 + cfg.num_agent_codebooks
        frame = model.mimi.frame_size

        self.gen = LMGen(model.lm, b, depformer_steps=depformer_steps)
        self.encoder = model.mimi.init_encoder_state(b)
        self.decoder = model.mimi.init_decoder_state(b)
        self.sampling = RowSampling.greedy_rows(b, dev)
        self.noise = RowNoise(b, cfg.text_card, self.gen.depformer_steps, cfg.card, dev)
        self.voice_embeddings = torch.zeros(b, max(voice_steps, VOICE_CAPACITY_STEPS), cfg.dim, device=dev,
                                            dtype=model.lm.dtype)
        self.voice_cache = self.gen.cache.tokens.clone()
        self.rows = torch.arange(b, device=dev)

        self.control = torch.zeros(b, k + CONTROL_EXTRA, dtype=torch.long, device=dev)
        self.pcm = torch.zeros(b, frame, dtype=torch.float32, device=dev)
        self.packed = torch.zeros(b, k + 1 + frame, dtype=torch.float32, device=dev)
        pin = dev.type == "cuda"
        self.host_control = torch.zeros(self.control.shape, dtype=torch.long, pin_memory=pin)
        self.host_pcm = torch.zeros(self.pcm.shape, dtype=torch.float32, pin_memory=pin)
        self.host_packed = torch.zeros(self.packed.shape, dtype=torch.float32, pin_memory=pin)
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self.path = TickPath.EAGER
        self._replay: Callable[[], None] | None = None

    @property
    def voice_capacity(self) -> int:
        return self.voice_embeddings.shape[1]

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """The engine's device, stream and attention kernels, whichever thread calls (no-op off CUDA)."""
        if self.stream is None:
            yield
            return
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream), attention_kernels():
            yield

    # --- at load ----------------------------------------------------------------------

    def prepare(self, recorder: GraphRecorder | None = None) -> TickPath:
        """Warm up (two ticks with every row masked: CUDA's lazy set-up), then record the graph if asked.

        A capture that fails leaves the engine eager: one loud log line, and
        :attr:`path` says so.  Nothing of any row moves.  Returns :attr:`path`.
        """
        began = time.perf_counter()
        with self.on_device():
            self.control.zero_()
            for _ in range(2):
                self.run()
            if recorder is not None:
                try:
                    self._replay = recorder.record(self.run, self.stream)
                except Exception as exc:  # any capture error: the eager path still works
                    self._replay = None
                    self.path = TickPath.EAGER_AFTER_FAILED_CAPTURE
                    logger.error("CUDA graph capture of the engine tick FAILED (%s: %s): every tick runs eagerly, "
                                 "with more launch overhead per tick; /health says tick_path=%s",
                                 type(exc).__name__, exc, self.path)
                else:
                    self.path = TickPath.CUDA_GRAPH
            self.synchronize()
        what = {TickPath.CUDA_GRAPH: "warm-up and CUDA graph capture", TickPath.EAGER: "warm-up",
                TickPath.EAGER_AFTER_FAILED_CAPTURE: "warm-up and a failed capture"}[self.path]
        logger.info("engine tick ready (%d rows, %s) after %s in %.2f s", self.batch_size, self.path, what,
                    time.perf_counter() - began)
        return self.path

    # --- between ticks --------------------------------------------------------------

    def reset_rows(self, mask: torch.Tensor) -> None:
        """Rows in ``mask`` start fresh streams (LM and Mimi); the others are untouched."""
        self.gen.reset(mask)
        self.encoder.reset(mask)
        self.decoder.reset(mask)

    def reset_all(self) -> None:
        """Every row fresh, in place (the recorded graph reads the same buffers)."""
        self.reset_rows(torch.ones(self.batch_size, dtype=torch.bool, device=self.device))
        self.sampling.set_greedy()
        self.noise.reset()
        self.voice_embeddings.zero_()
        self.control.zero_()

    def store_voice(self, row: int, voice: VoicePrompt) -> None:
        """Keep ``voice`` for ``row``'s prompt replay (``ValueError`` if it is longer than the buffer)."""
        steps = voice.num_steps
        if steps > self.voice_capacity:
            raise ValueError(f"voice {voice.name} is {steps} steps long; this engine holds voices of up to "
                             f"{self.voice_capacity} steps ({self.voice_capacity * 0.08:.0f} s)")
        self.voice_embeddings[row, :steps] = voice.embeddings.to(self.device, self.voice_embeddings.dtype)
        self.voice_cache[row] = voice.cache[0].to(self.device)

    # --- one tick -------------------------------------------------------------------

    def upload(self, with_pcm: bool) -> None:
        """Copy the host staging buffers to the device (before any kernel of the tick)."""
        self.control.copy_(self.host_control, non_blocking=True)
        if with_pcm:
            self.pcm.copy_(self.host_pcm, non_blocking=True)

    @torch.no_grad()
    def run(self, *, mimi: bool = True, voice: bool = True, depformer: bool = True, sample: bool = True) -> None:
        """The tick's device work, from ``control`` / ``pcm`` (and the states) into ``packed``.

        With every part on this is what the CUDA graph records.  The eager
        engine switches off the parts a tick does not need (``mimi`` and
        ``depformer`` without LIVE rows, ``voice`` without a row in its
        voice prompt, ``sample`` when every LIVE row is greedy); the result
        is the same, as the parts only matter for those rows.
        """
        k, card = self.num_streams, self.cfg.card
        control = self.control
        tokens = control[:, :k]
        live, exec_mask, embed_mask, restore_mask = (control[:, k + col].bool() for col in (LIVE, EXEC, EMBED, RESTORE))
        if mimi:
            codes = self.model.mimi.encode_frame(self.pcm, self.encoder, live)
            user = torch.where(live[:, None], codes, tokens[:, self.first_user:])
            tokens = torch.cat([tokens[:, : self.first_user], user], dim=1)
        inputs = StepInputs(tokens=tokens, exec_mask=exec_mask)
        if voice:
            inputs.embeddings = self.voice_embeddings[self.rows, control[:, k + VOICE_STEP]]
            inputs.embed_mask = embed_mask
            inputs.restore_cache = self.voice_cache
            inputs.restore_mask = restore_mask
        noise = self.noise.draw(live & exec_mask) if sample else None
        result = self.gen.step(inputs, self.sampling, noise, run_depformer=depformer)

        self.packed[:, :k].copy_(result.tokens)
        self.packed[:, k].copy_(result.valid)
        out_pcm = self.packed[:, k + 1:]
        if mimi:
            # Only frames that exist are decoded: a row without one yet stays silent and its decoder still.
            agent = result.tokens[:, 1: self.first_user]
            speak = live & ((agent >= 0) & (agent < card)).all(dim=1)
            pcm = self.model.mimi.decode_frame(agent.clamp(0, card - 1), self.decoder, speak)
            out_pcm.copy_(torch.where(speak[:, None], pcm, 0.0))
        else:
            out_pcm.zero_()

    def replay(self) -> bool:
        """Run the tick as the recorded graph; False (nothing run) when there is none."""
        if self._replay is None:
            return False
        self._replay()
        return True

    def download(self) -> np.ndarray:
        """The tick's one device->host copy: ``packed`` as a host array (valid until the next tick)."""
        self.host_packed.copy_(self.packed, non_blocking=self.stream is not None)
        self.synchronize()
        return self.host_packed.numpy()

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def unpack(self, host: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens int64 [B, K], valid bool [B], pcm float32 [B, frame])``, copies of a :meth:`download`."""
        k = self.num_streams
        return host[:, :k].astype(np.int64), host[:, k] > 0.5, host[:, k + 1:].copy()
