"""The real engine: PersonaPlex / Moshi on our own torch implementation.

All slots advance together, one 80 ms frame per :meth:`PersonaPlexEngine.step`:
one batched Mimi encode of the LIVE rows, one batched LM step (PREFILL rows
take their next forced system-prompt step, LIVE rows feed their user codes
and sample), one batched Mimi decode of the LIVE rows' agent codes, and one
read of the results to the host.  IDLE rows are carried along in the
tensors but their state never moves, so they disturb nobody (themselves
included).

:meth:`~PersonaPlexEngine.start` resets one row and queues its system
prompt; the other rows are untouched (bit for bit).  Everything per row
that lives on the host (persona, prompt cursor, text detokenizer) is in
this object; every tensor, and the tick's device work, is in
:class:`~pplex_trio.engine._tick.DeviceTick`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
import torch

from ..model import (FREE, LoadedModel, PromptPlan, StreamDecoder, VoiceNotFoundError, build_prompt_plan, lm_dtype_for,
                     load_config, load_model)
from ._fit import GIB, NotEnoughMemory, auto_slots, out_of_memory_message
from ._interface import Conversation, ConversationRejected, Engine, SlotMode, StepOutput
from ._tick import EMBED, EXEC, LIVE, RESTORE, VOICE_STEP, CudaGraphs, DeviceTick, GraphRecorder

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Row:
    plan: PromptPlan | None = None
    cursor: int = 0  # next prompt step
    decoder: StreamDecoder | None = None
    greedy: bool = True


class PersonaPlexEngine(Engine):
    """A batch of ``num_slots`` PersonaPlex conversations on one model.

    ``depformer_steps`` defaults to the agent codebooks only (the user's
    are teacher-forced; running them changes nothing but the cost).
    ``default_voice`` is used when a conversation asks for none (default:
    the first voice of the library; ``""``: no voice prompt).

    A LIVE row whose LM frame does not exist yet (the first tick of a
    conversation without system prompt, as on Kyutai's Moshi models)
    returns silence, and its Mimi decoder does not step: both references'
    servers skip a step that returned nothing, so the decoder sees exactly
    the frames they decode.  No codebook entry is assumed to be silence,
    so this holds for any codebook size.

    The engine is ready for its first conversation when it is built: the
    tick has been warmed up (CUDA's lazy set-up paid) and, with
    ``cuda_graph=True`` (CUDA only, off by default), recorded as a CUDA
    graph that every tick replays (see
    :class:`~pplex_trio.engine._tick.DeviceTick`): one graph for every mix
    of IDLE, PREFILL and LIVE rows, since rows that do not execute are
    masked, not skipped.  It therefore always runs Mimi, the depformer and
    the sampling code, which the eager path skips on ticks that do not
    need them (e.g. prompt-only ticks); the results are the same.  A capture
    that fails leaves the engine eager (:attr:`tick_path` says so).
    ``graphs`` replaces the CUDA graph recorder (tests).  The voice buffer
    holds the longest voice of the library (at least 20 s), so no voice
    ever changes what the graph reads.

    Error handling: ``ValueError`` for ``cuda_graph=True`` on a model that
    is not on a CUDA device.
    """

    def __init__(self, model: LoadedModel, num_slots: int, *, default_voice: str | None = None,
                 depformer_steps: int | None = None, cuda_graph: bool = False, graphs: GraphRecorder | None = None):
        if num_slots < 1:
            raise ValueError("num_slots must be at least 1")
        if cuda_graph and graphs is None:
            graphs = CudaGraphs(model.device)
        self.model = model
        self.num_slots = num_slots
        self.device = model.device
        cfg = model.config
        self._cfg = cfg
        names = model.voices.names()
        if default_voice is None:
            default_voice = names[0] if names else ""
        elif default_voice and default_voice not in names:
            raise ValueError(f"default voice {default_voice!r} is not in the voice library ({', '.join(names) or 'empty'})")
        self.default_voice = default_voice or None
        self._shortcuts = True  # eager ticks skip the parts they do not need (tests turn this off)
        self._rows = [_Row() for _ in range(num_slots)]
        self.last_tokens = np.full((num_slots, cfg.lm.num_streams), -2, dtype=np.int64)
        longest_voice = max((model.voices.get(name).num_steps for name in names), default=0)
        self._tick = DeviceTick(model, num_slots, depformer_steps=depformer_steps, voice_steps=longest_voice)
        self._tick.prepare(graphs if cuda_graph else None)

    @classmethod
    def load(cls, source: str, num_slots: int | None, device: str = "cpu", voice_dir: str | None = None,
             cuda_graph: bool = False, memory_reserve: int = 2 * GIB, **kwargs) -> "PersonaPlexEngine":
        """Load ``source`` (``tiny``, a Hugging Face repo id or a local folder) and build an engine.

        ``num_slots=None`` sizes the batch to the device: as many
        conversations as fit its free memory once the weights are loaded,
        less ``memory_reserve`` bytes (:func:`~pplex_trio.engine._fit.auto_slots`).
        On CPU with a small model, torch is limited to one intra-op thread:
        tiny ops gain nothing from threads, and on a busy machine each
        multi-threaded op can stall for tens of milliseconds.
        ``cuda_graph=True`` needs a CUDA ``device`` (checked before loading).

        Error handling: :class:`~pplex_trio.engine._fit.NotEnoughMemory` (one
        line with the figures and the way out) when the device runs out of
        memory loading the weights, building the batch or capturing the graph.
        """
        if cuda_graph:
            CudaGraphs(torch.device(device))  # refuses a device without CUDA, before loading gigabytes
        doing = "loading the weights"
        try:
            model = load_model(source, device=device, voice_dir=voice_dir)
            if model.device.type == "cpu" and model.config.lm.dim <= 1024 and torch.get_num_threads() > 1:
                logger.info("small model on CPU: using one torch thread")
                torch.set_num_threads(1)
            if num_slots is None:
                num_slots = auto_slots(model, memory_reserve, depformer_steps=kwargs.get("depformer_steps"))
            doing = "building the engine and capturing its tick" if cuda_graph else "building the engine"
            return cls(model, num_slots, cuda_graph=cuda_graph, **kwargs)
        except torch.OutOfMemoryError:
            where = torch.device(device)
            raise NotEnoughMemory(out_of_memory_message(doing, load_config(source), lm_dtype_for(where), where,
                                                        num_slots)) from None

    # --- Engine interface ---------------------------------------------------------

    @property
    def name(self) -> str:
        return self._cfg.name

    @property
    def tick_path(self) -> str:
        return str(self._tick.path)

    def voices(self) -> Sequence[str]:
        return self.model.voices.names()

    def start(self, slot: int, conversation: Conversation) -> int:
        """Reset row ``slot`` and queue its system prompt; returns the PREFILL steps it needs.

        Error handling: an unknown or invalid voice (or one made for another
        model) raises :class:`ConversationRejected` with a message for the
        client; the row is then left as it was.
        """
        self._check_slot(slot)
        voice_name = conversation.voice if conversation.voice is not None else self.default_voice
        if not self._cfg.prompt.enabled:
            if conversation.persona or conversation.voice:
                logger.info("%s has no system prompt: persona and voice are ignored", self.name)
            voice_name = None
        try:
            voice = self.model.voices.get(voice_name) if voice_name is not None else None
            plan = build_prompt_plan(self._cfg, self.model.tokenizer, conversation.persona, voice)
            if voice is not None and voice.num_steps > self._tick.voice_capacity:
                raise ValueError(f"voice {voice.name} is {voice.num_steps} frames long; this server takes voices "
                                 f"of up to {self._tick.voice_capacity} frames")
        except (VoiceNotFoundError, ValueError) as exc:
            raise ConversationRejected(str(exc)) from exc
        with self._tick.on_device():
            self._reset_row(slot)
            if voice is not None:
                self._tick.store_voice(slot, voice)
            s = conversation.sampling
            self._tick.sampling.set_row(slot, s)
            self._tick.noise.seed(slot, s.text_seed, s.audio_seed)
        self._rows[slot] = _Row(plan=plan, decoder=self.model.tokenizer.decoder(),
                                greedy=s.greedy or (s.text_temperature <= 0 and s.audio_temperature <= 0))
        return plan.num_steps

    def reset(self, slot: int) -> None:
        self._check_slot(slot)
        with self._tick.on_device():
            self._reset_row(slot)
        self._rows[slot] = _Row()

    def reset_all(self) -> None:
        with self._tick.on_device():
            self._tick.reset_all()
        self._rows = [_Row() for _ in range(self.num_slots)]

    @torch.no_grad()
    def step(self, modes: Sequence[SlotMode], pcm: np.ndarray) -> StepOutput:
        if len(modes) != self.num_slots:
            raise ValueError(f"expected {self.num_slots} modes, got {len(modes)}")
        with self._tick.on_device():
            return self._step(modes, pcm)

    def _step(self, modes: Sequence[SlotMode], pcm: np.ndarray) -> StepOutput:
        b, cfg, tick = self.num_slots, self._cfg.lm, self._tick
        live_rows = [i for i, m in enumerate(modes) if m == SlotMode.LIVE]
        prefill_rows = [i for i, m in enumerate(modes) if m == SlotMode.PREFILL]
        # What the device needs from the host this tick: forced tokens, voice step, row flags (one
        # int64 buffer) and the input audio.  Both go over before any kernel is queued.
        k = cfg.num_streams
        control = tick.host_control.numpy()
        control[:] = 0
        control[:, :k] = FREE
        voice_rows = []
        for i in prefill_rows:
            row = self._rows[i]
            if row.plan is None or row.cursor >= row.plan.num_steps:
                raise RuntimeError(f"slot {i} is PREFILL but has no prompt step left: call start() first")
            control[i, :k] = row.plan.tokens[row.cursor]
            if row.cursor < row.plan.voice_steps:
                voice_rows.append(i)
                control[i, k + VOICE_STEP] = row.cursor
                control[i, k + EMBED] = 1
                control[i, k + RESTORE] = row.cursor == row.plan.voice_steps - 1
        control[live_rows, k + LIVE] = 1
        control[live_rows + prefill_rows, k + EXEC] = 1
        if live_rows:
            np.copyto(tick.host_pcm.numpy(), pcm, casting="same_kind")
        tick.upload(with_pcm=bool(live_rows))
        sampled_rows = [i for i in live_rows if not self._rows[i].greedy]
        if tick.replay():
            pass  # the recorded graph: every part, every row
        elif self._shortcuts:
            tick.run(mimi=bool(live_rows), voice=bool(voice_rows), depformer=bool(live_rows),
                     sample=bool(sampled_rows))
        else:
            tick.run()
        tokens, valid, pcm_out = tick.unpack(tick.download())  # the tick's one read back to the host

        self.last_tokens = tokens
        text: list[str | None] = [None] * b
        for i in prefill_rows:
            self._rows[i].cursor += 1
        for i in live_rows:
            row = self._rows[i]
            if row.plan is not None:
                row.cursor = row.plan.num_steps
            if valid[i] and row.decoder is not None:
                text[i] = row.decoder.push(int(tokens[i, 0]))
        return StepOutput(pcm=pcm_out, text=text)

    # --- helpers ------------------------------------------------------------------

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range 0..{self.num_slots - 1}")

    def _mask(self, rows: list[int]) -> torch.Tensor:
        mask = torch.zeros(self.num_slots, dtype=torch.bool)
        mask[rows] = True
        return mask.to(self.device)

    def _reset_row(self, slot: int) -> None:
        self._tick.reset_rows(self._mask([slot]))
