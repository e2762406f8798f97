"""One engine tick on the device: static buffers in, one packed buffer out, optionally a CUDA graph.

:meth:`DeviceTick.run` is all the device work of a tick: Mimi encode of the
LIVE rows, one LM step (temporal transformer, sampling noise, text
sampling, depformer), Mimi decode of the frames that exist.  It reads only
preallocated buffers (the rows' LIVE flags and PCM inputs, the sampling
settings and seeds) and the streaming states, and it writes only the
states (in place) and one preallocated output buffer.  System prompts are
not part of a tick: the engine runs them between ticks, in chunks
(``PersonaPlexEngine.prefill``).  No host sync, no
Python branch on a device value, no tensor that outlives the call is
allocated.  That is what lets a CUDA graph record it once, **at load**
(:meth:`DeviceTick.prepare`), and replay it every tick.  It is also what
``torch.compile`` (``compile=True``) can take whole: one graph, no breaks
(inductor's fused kernels, then the CUDA graph records those).

Host <-> device traffic per tick:

* before any kernel, two host->device copies from staging buffers (pinned
  on CUDA): ``live`` (int64 ``[B]``, 1 for a LIVE row) and ``pcm``
  (float32 ``[B, frame]``);
* after the work, **one** device->host copy of ``packed`` (float32
  ``[B, K + 1 + frame]``: the de-delayed tokens, exact in float32 as every
  id is below 2**24, the valid flag, the output PCM; then a transcriber's
  token, valid flag and end-of-turn probability: ``engine/_transcribing.py``,
  stepped by :meth:`DeviceTick.listen` on the same encode's 32 levels, in the
  graph or, eagerly, apart), which on CUDA is the tick's only sync.

Rows that do not execute keep their state bit for bit (the model package's
rule), so the graph serves every mix of IDLE and LIVE rows, and a warm-up
tick with every row masked out disturbs no conversation.

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

import numpy as np
import torch

from ..model import FREE, LMGen, LoadedModel, RowNoise, RowSampling, StepInputs
from ._transcribing import HEARD_COLUMNS, EngineTranscriber

logger = logging.getLogger(__name__)

FLOAT32_EXACT = 2**24
"""Integers below this are exact in float32: every token id must be (checked at construction)."""

PASS_POSITIONS = 1024
"""System-prompt positions in one prefill pass, all rows together: bounds the pass's temporary memory."""

CHECK_TICKS = 6
"""Ticks of noise a recorded graph replays at load beside the eager tick, before it is trusted."""

CHECK_PCM_TOLERANCE = 1e-3
"""The largest difference in output PCM allowed between the replay and the eager tick (tokens: none)."""


class TickPath(enum.StrEnum):
    """How the engine runs its ticks (``/health`` shows it)."""

    EAGER = "eager"
    CUDA_GRAPH = "cuda_graph"
    EAGER_AFTER_FAILED_CAPTURE = "eager_after_failed_capture"  # asked for a graph; its capture failed
    EAGER_AFTER_FAILED_CHECK = "eager_after_failed_check"  # its replay did not give the eager tick's output
    COMPILED = "compiled"  # torch.compile's tick, run as it is
    COMPILED_CUDA_GRAPH = "compiled_cuda_graph"  # torch.compile's tick recorded as a CUDA graph


class CudaGraphs:
    """Records a function once as a ``torch.cuda.graph``, on the engine's own stream, and returns its replay."""

    def __init__(self, device: torch.device):
        if device.type != "cuda" or not torch.cuda.is_available():
            raise ValueError(
                f"cuda_graph=True needs the model on a CUDA device, not {device} "
                f"(CUDA available here: {torch.cuda.is_available()}): use device='cuda' "
                "or leave cuda_graph off"
            )
        self.graph: torch.cuda.CUDAGraph | None = None

    def record(self, fn: Callable[[], None], stream: torch.cuda.Stream | None) -> Callable[[], None]:
        """Capture one run of ``fn`` on ``stream`` (kept in :attr:`graph`); returns the graph's ``replay``."""
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
    seeds, the input/output buffers and their host staging copies.  The
    engine fills ``host_live`` / ``host_pcm``, calls :meth:`upload`,
    :meth:`run` or :meth:`replay`, then :meth:`download`.

    Call :meth:`prepare` once before the first tick: it warms up and, given
    a :class:`CudaGraphs`, records the tick (``path`` says what runs).

    ``compile=True`` runs the tick through ``torch.compile`` (one graph,
    static shapes; compiled during the warm-up), used only if a few ticks
    of noise give the eager tick's tokens (:meth:`prepare`); on a CUDA
    device the graph then records the compiled tick.

    ``transcriber``: stepped in every tick on the same codes (:meth:`listen`).
    """

    def __init__(
        self,
        model: LoadedModel,
        batch_size: int,
        *,
        depformer_steps: int | None = None,
        compile: bool = False,
        transcriber: EngineTranscriber | None = None,
    ):
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
        self.transcriber = transcriber
        self.levels = max(model.mimi.num_codebooks, transcriber.levels if transcriber else 0)
        self.heard_at = k + 1 + frame  # the transcriber's columns in packed

        self.gen = LMGen(model.lm, b, depformer_steps=depformer_steps)
        self.encoder = model.mimi.init_encoder_state(b)
        self.decoder = model.mimi.init_decoder_state(b)
        self.sampling = RowSampling.greedy_rows(b, cfg.text_card, cfg.card, dev)
        self.noise = RowNoise(b, cfg.text_card, self.gen.depformer_steps, cfg.card, dev)
        self.free_tokens = torch.full((b, self.first_user), FREE, dtype=torch.long, device=dev)

        self.live = torch.zeros(b, dtype=torch.long, device=dev)
        self.pcm = torch.zeros(b, frame, dtype=torch.float32, device=dev)
        self.packed = torch.zeros(b, self.heard_at + (HEARD_COLUMNS if transcriber else 0), device=dev)
        self.heard_columns = self.packed[:, self.heard_at :]  # (a view: the transcriber writes into packed)
        self.silence = torch.zeros((), dtype=torch.float32, device=dev)
        pin = dev.type == "cuda"
        self.host_live = torch.zeros(self.live.shape, dtype=torch.long, pin_memory=pin)
        self.host_pcm = torch.zeros(self.pcm.shape, dtype=torch.float32, pin_memory=pin)
        self.host_packed = torch.zeros(self.packed.shape, dtype=torch.float32, pin_memory=pin)
        self.stream: torch.cuda.Stream | None = None
        if dev.type == "cuda":
            self.stream = torch.cuda.Stream(dev)  # type: ignore[no-untyped-call]  # unannotated in torch
        self.path = TickPath.EAGER
        self._replay: Callable[[], None] | None = None
        self._compiled: Callable[[], None] | None = None
        if compile:
            # Always sampling (as the CUDA graph does): one compiled graph whichever rows are greedy.
            self._compiled = torch.compile(self._sampled, fullgraph=True, dynamic=False)

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """The engine's device, stream and attention kernels, whichever thread calls (no-op off CUDA)."""
        if self.stream is None:
            yield
            return
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream), attention_kernels():
            yield

    # --- at load ----------------------------------------------------------------------

    def prepare(self, recorder: CudaGraphs | None = None) -> TickPath:
        """Warm up (two ticks with every row masked: CUDA's lazy set-up), then record the graph if asked.

        A recorded graph is trusted only once its replay of a few ticks of
        noise gives what the eager tick gives from the same state (tokens
        equal, PCM within :data:`CHECK_PCM_TOLERANCE`).  A capture or a
        check that fails leaves the engine eager: one loud log line, and
        :attr:`path` says which.  Every row ends fresh.  Returns :attr:`path`.
        """
        began = time.perf_counter()
        with self.on_device():
            self.live.zero_()
            if self._compiled is not None:
                self.path = self._compile()
            for _ in range(2):
                self.run()
            if recorder is not None:
                self.path = self._record(recorder)
            self.synchronize()
        what = {
            TickPath.CUDA_GRAPH: "warm-up, CUDA graph capture and its check",
            TickPath.EAGER: "warm-up",
            TickPath.EAGER_AFTER_FAILED_CAPTURE: "warm-up and a failed capture",
            TickPath.EAGER_AFTER_FAILED_CHECK: "warm-up and a failed check",
            TickPath.COMPILED: "torch.compile and its check",
            TickPath.COMPILED_CUDA_GRAPH: "torch.compile, CUDA graph capture and their checks",
        }[self.path]
        logger.info(
            "engine tick ready (%d rows, %s) after %s in %.2f s",
            self.batch_size,
            self.path,
            what,
            time.perf_counter() - began,
        )
        return self.path

    def _compile(self) -> TickPath:
        """Compile the tick (its first call) and check it against the eager tick; uncompiled if either fails."""
        assert self._compiled is not None
        try:
            self._compiled()  # compiles, every row masked: nothing of any row moves
            problem = self._differs(self.run)  # (the compiled tick, then the transcriber's step)
        except Exception as exc:  # any compile error: the eager path still works
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            return TickPath.COMPILED
        self._compiled = None
        self.reset_all()
        logger.error(
            "torch.compile of the engine tick FAILED (%s): every tick runs uncompiled; /health says tick_path=%s",
            problem,
            TickPath.EAGER_AFTER_FAILED_CHECK,
        )
        return TickPath.EAGER_AFTER_FAILED_CHECK

    def _record(self, recorder: CudaGraphs) -> TickPath:
        try:
            self._replay = recorder.record(self.run, self.stream)
            problem = self._differs(self._replay)
        except Exception as exc:  # any capture error: the eager path still works
            self._replay = None
            self.reset_all()
            logger.error(
                "CUDA graph capture of the engine tick FAILED (%s: %s): every tick runs eagerly, with more "
                "launch overhead per tick; /health says tick_path=%s",
                type(exc).__name__,
                exc,
                TickPath.EAGER_AFTER_FAILED_CAPTURE,
            )
            return TickPath.EAGER_AFTER_FAILED_CAPTURE
        if problem is not None:
            self._replay = None
            logger.error(
                "the CUDA graph of the engine tick FAILED its check (%s): every tick runs eagerly, with more "
                "launch overhead per tick; /health says tick_path=%s",
                problem,
                TickPath.EAGER_AFTER_FAILED_CHECK,
            )
            return TickPath.EAGER_AFTER_FAILED_CHECK
        return TickPath.COMPILED_CUDA_GRAPH if self._compiled is not None else TickPath.CUDA_GRAPH

    def _differs(self, tick: Callable[[], None]) -> str | None:
        """Run :data:`CHECK_TICKS` ticks of noise on every row eagerly, then again from the same fresh state
        with ``tick`` (a replay, the compiled tick); what differs (None: nothing).  Every row is left fresh."""
        noise = torch.Generator().manual_seed(0)
        frames = 0.1 * torch.randn((CHECK_TICKS, *self.host_pcm.shape), generator=noise)

        def run_ticks(fn: Callable[[], None]) -> list[np.ndarray]:
            self.reset_all()
            outputs = []
            for frame in frames:
                self.host_live.fill_(1)
                self.host_pcm.copy_(frame)
                self.upload()
                fn()
                outputs.append(self.download().copy())
            return outputs

        def eager() -> None:
            self._eager(sample=True)
            self.listen()

        eager_outputs, replayed = run_ticks(eager), run_ticks(tick)
        self.reset_all()
        k, h = self.num_streams, self.heard_at
        for index, (want, got) in enumerate(zip(eager_outputs, replayed)):
            exact = np.r_[0 : k + 1, h : min(h + 2, want.shape[1])]  # the tokens and valid flags of both models
            if not np.array_equal(want[:, exact], got[:, exact]):
                return f"tick {index + 1} of {CHECK_TICKS}: its tokens differ from the eager tick's"
            close = np.r_[k + 1 : h, h + 2 : want.shape[1]]  # the PCM, the end-of-turn probability
            difference = float(np.abs(want[:, close] - got[:, close]).max())
            if not difference <= CHECK_PCM_TOLERANCE:
                return (
                    f"tick {index + 1} of {CHECK_TICKS}: its PCM differs from the eager tick's by {difference:.3g} "
                    f"(at most {CHECK_PCM_TOLERANCE:g} allowed)"
                )
        return None

    # --- between ticks --------------------------------------------------------------

    def reset_rows(self, mask: torch.Tensor) -> None:
        """Rows in ``mask`` start fresh streams (LM and Mimi); the others are untouched."""
        self.gen.reset(mask)
        self.encoder.reset(mask)
        self.decoder.reset(mask)
        if self.transcriber is not None:
            self.transcriber.reset(mask)

    def reset_all(self) -> None:
        """Every row fresh, in place (the recorded graph reads the same buffers)."""
        every = torch.ones(self.batch_size, dtype=torch.bool, device=self.device)
        self.reset_rows(every)
        self.sampling.set_greedy()
        self.noise.reset(every)
        self.live.zero_()

    # --- one tick -------------------------------------------------------------------

    def upload(self) -> None:
        """Copy the host staging buffers to the device (before any kernel of the tick)."""
        self.live.copy_(self.host_live, non_blocking=True)
        self.pcm.copy_(self.host_pcm, non_blocking=True)

    def run(self, *, sample: bool = True, listen: bool = True) -> None:
        """The tick's device work, from ``live`` / ``pcm`` (and the states) into ``packed``.

        With ``sample`` on this is what the CUDA graph records; the eager
        engine switches it off when every LIVE row is greedy (the same result:
        the noise matters only to sampled rows); a compiled tick always samples.
        ``listen=False`` leaves out the transcriber's step (the eager engine runs it apart).
        """
        if self._compiled is not None:
            self._compiled()
        else:
            self._eager(sample=sample)
        if listen:
            self.listen()

    def listen(self) -> None:
        """The transcriber's step on the LIVE rows, from this tick's codes into its columns (none: nothing)."""
        if self.transcriber is not None:
            self.transcriber.step(self.live.bool(), self.heard_columns)

    def _sampled(self) -> None:
        self._eager(sample=True)

    @torch.no_grad()
    def _eager(self, *, sample: bool) -> None:
        card = self.cfg.card
        live = self.live.bool()
        codes = self.model.mimi.encode_frame(self.pcm, self.encoder, live, num_codebooks=self.levels)
        if self.transcriber is not None:
            self.transcriber.codes.copy_(codes)
            codes = codes[:, : self.model.mimi.num_codebooks]  # PersonaPlex's, bit for bit
        inputs = StepInputs(tokens=torch.cat([self.free_tokens, codes], dim=1), exec_mask=live)
        noise = self.noise.draw(live) if sample else None
        result = self.gen.step(inputs, self.sampling, noise)

        k = self.num_streams
        self.packed[:, :k].copy_(result.tokens)
        self.packed[:, k].copy_(result.valid)
        # Only frames that exist are decoded: a row without one yet stays silent and its decoder still.
        agent = result.tokens[:, 1 : self.first_user]
        speak = live & ((agent >= 0) & (agent < card)).all(dim=1)
        pcm = self.model.mimi.decode_frame(agent.clamp(0, card - 1), self.decoder, speak)
        self.packed[:, k + 1 : self.heard_at].copy_(torch.where(speak[:, None], pcm, self.silence))

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
        """Wait for the engine's own stream, if it has one (the default stream is left alone)."""
        if self.stream is not None:
            self.stream.synchronize()

    def unpack(self, host: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens int64 [B, K], valid bool [B], pcm float32 [B, frame])``, copies of a :meth:`download`."""
        k = self.num_streams
        return host[:, :k].astype(np.int64), host[:, k] > 0.5, host[:, k + 1 : self.heard_at].copy()

    def unpack_heard(self, host: np.ndarray) -> tuple[list[int], list[bool], list[float]]:
        """The transcriber's ``(token, valid, end-of-turn probability)`` per row, from a :meth:`download`."""
        h = self.heard_at
        return host[:, h].astype(np.int64).tolist(), (host[:, h + 1] > 0.5).tolist(), host[:, h + 2].tolist()
