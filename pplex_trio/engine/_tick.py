"""One engine tick on the device: static buffers in, one packed buffer out, optionally a CUDA graph.

:meth:`DeviceTick.run` is all the device work of a tick: Mimi encode of the
LIVE rows, one LM step (temporal transformer, text sampling, depformer),
Mimi decode of the frames that exist.  It reads only preallocated buffers
(the control and PCM inputs, the sampling settings and noise, the voice
prompts) and the streaming states, and it writes only the states (in
place) and one preallocated output buffer.  No host sync, no Python branch
on a device value, no tensor that outlives the call is allocated.  That is
what lets :meth:`DeviceTick.capture` record it once as a CUDA graph and
:meth:`DeviceTick.replay` it every tick.

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
rule), so the graph serves every mix of IDLE, PREFILL and LIVE rows.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..model import LMGen, LoadedModel, RowNoise, RowSampling, StepInputs, VoicePrompt

logger = logging.getLogger(__name__)

# Columns of ``control`` after the K forced tokens.
VOICE_STEP, LIVE, EXEC, EMBED, RESTORE = range(5)
CONTROL_EXTRA = 5

FLOAT32_EXACT = 2**24
"""Integers below this are exact in float32: every token id must be (checked at construction)."""


class DeviceTick:
    """The device half of a :class:`~pplex_trio.engine._personaplex.PersonaPlexEngine`.

    Owns every tensor a tick touches, allocated once for ``batch_size``
    rows: the LM and Mimi streaming states, per-row sampling settings and
    noise, the voice prompts of the rows, the input/output buffers and
    their host staging copies.  The engine fills ``host_control`` /
    ``host_pcm``, calls :meth:`upload`, :meth:`run` or :meth:`replay`, then
    :meth:`download`.

    ``cuda_graph`` (CUDA only): :meth:`replay` runs the recorded graph of
    :meth:`run` with every part on, capturing it on first use and again
    after a buffer it reads was reallocated (a voice prompt longer than any
    before, see :meth:`store_voice`).  **Untested on hardware**: the CPU
    tests check its preconditions (static buffers, no host reads, same
    results with every part on), not the capture itself.
    """

    def __init__(self, model: LoadedModel, batch_size: int, *, depformer_steps: int | None = None,
                 cuda_graph: bool = False):
        cfg = model.config.lm
        if max(cfg.text_card, cfg.card) + 1 >= FLOAT32_EXACT:
            raise ValueError(f"vocabularies of {cfg.text_card} / {cfg.card} tokens do not fit the float32 read-back")
        self.model = model
        self.cfg = cfg
        self.device = dev = model.device
        self.batch_size = b = batch_size
        self.cuda_graph = cuda_graph
        self.num_streams = k = cfg.num_streams
        self.first_user = 1 + cfg.num_agent_codebooks
        frame = model.mimi.frame_size

        self.gen = LMGen(model.lm, b, depformer_steps=depformer_steps)
        self.encoder = model.mimi.init_encoder_state(b)
        self.decoder = model.mimi.init_decoder_state(b)
        self.sampling = RowSampling.greedy_rows(b, dev)
        self.noise = RowNoise(b, cfg.text_card, self.gen.depformer_steps, cfg.card, dev)
        self.voice_embeddings = torch.zeros(b, 1, cfg.dim, device=dev, dtype=model.lm.dtype)
        self.voice_cache = self.gen.cache.tokens.clone()
        self.rows = torch.arange(b, device=dev)

        self.control = torch.zeros(b, k + CONTROL_EXTRA, dtype=torch.long, device=dev)
        self.pcm = torch.zeros(b, frame, dtype=torch.float32, device=dev)
        self.packed = torch.zeros(b, k + 1 + frame, dtype=torch.float32, device=dev)
        pin = dev.type == "cuda"
        self.host_control = torch.zeros(self.control.shape, dtype=torch.long, pin_memory=pin)
        self.host_pcm = torch.zeros(self.pcm.shape, dtype=torch.float32, pin_memory=pin)
        self.host_packed = torch.zeros(self.packed.shape, dtype=torch.float32, pin_memory=pin)
        self.graph: torch.cuda.CUDAGraph | None = None

    # --- between ticks --------------------------------------------------------------

    def reset_rows(self, mask: torch.Tensor) -> None:
        """Rows in ``mask`` start fresh streams (LM and Mimi); the others are untouched."""
        self.gen.reset(mask)
        self.encoder.reset(mask)
        self.decoder.reset(mask)

    def store_voice(self, row: int, voice: VoicePrompt) -> None:
        """Keep ``voice`` for ``row``'s prompt replay (the buffer grows for a longer voice than any before)."""
        steps = voice.num_steps
        if steps > self.voice_embeddings.shape[1]:
            grown = torch.zeros(self.batch_size, steps, self.voice_embeddings.shape[2],
                                device=self.device, dtype=self.voice_embeddings.dtype)
            grown[:, : self.voice_embeddings.shape[1]] = self.voice_embeddings
            self.voice_embeddings = grown
            self.drop_graph("the voice buffer grew")
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

    def download(self) -> np.ndarray:
        """The tick's one device->host copy: ``packed`` as a host array (valid until the next tick)."""
        cuda = self.device.type == "cuda"
        self.host_packed.copy_(self.packed, non_blocking=cuda)
        if cuda:
            torch.cuda.current_stream(self.device).synchronize()
        return self.host_packed.numpy()

    def unpack(self, host: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(tokens int64 [B, K], valid bool [B], pcm float32 [B, frame])``, copies of a :meth:`download`."""
        k = self.num_streams
        return host[:, :k].astype(np.int64), host[:, k] > 0.5, host[:, k + 1:].copy()

    # --- CUDA graph -----------------------------------------------------------------

    def replay(self) -> None:
        """Run the tick as the recorded CUDA graph.

        Order per tick: :meth:`prepare_graph` (records only when there is no
        valid recording; it overwrites ``control``), :meth:`upload`, then this.
        """
        if not self.cuda_graph:
            raise RuntimeError("this DeviceTick was built without cuda_graph=True")
        if self.graph is None:
            raise RuntimeError("call prepare_graph() before upload(), then replay()")
        self.graph.replay()

    def prepare_graph(self) -> None:
        """Record :meth:`run` (every part on) as a CUDA graph, unless a valid recording exists.

        Before recording, the tick runs twice eagerly on a side stream, for
        CUDA's lazy initialisations (cuBLAS handles, cuDNN plans, allocator
        pools).  Every row is masked out (``control`` all zero: nothing
        executes), and rows that do not execute keep their state, so
        neither the warm-up nor the recording disturbs a conversation; the
        next :meth:`upload` overwrites ``control``.
        """
        if not self.cuda_graph or self.graph is not None:
            return
        if self.device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"CUDA graphs need a CUDA device, not {self.device}")
        self.control.zero_()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(2):
                self.run()
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.run()
        self.graph = graph
        logger.info("CUDA graph of the engine tick recorded (%d rows)", self.batch_size)

    def drop_graph(self, why: str) -> None:
        """Forget the recorded graph (a buffer it reads was reallocated); the next tick records a new one."""
        if self.graph is not None:
            logger.info("CUDA graph dropped: %s", why)
            self.graph.reset()
            self.graph = None
