"""The real engine: PersonaPlex / Moshi on our own torch implementation.

All LIVE slots advance together, one 80 ms frame per :meth:`PersonaPlexEngine.step`:
one batched Mimi encode, one batched LM step (the rows feed their user codes
and sample), one batched Mimi decode of the agent codes, and one read of the
results to the host.  IDLE rows are carried along in the tensors but their
state never moves, so they disturb nobody (themselves included).

A conversation's system prompt (voice, silence, persona, silence) is not
stepped frame by frame: every token of it is given, so
:meth:`~PersonaPlexEngine.prefill` runs it between ticks as chunks of many
positions of the temporal transformer, straight into the row's KV ring
(the model's ``prefill``); the row's token cache is set to where the prompt
leaves it when the conversation starts.  A prompt of a few hundred
positions takes a chunk or two, not one tick per position.

:meth:`~PersonaPlexEngine.start` resets one row and plans its system
prompt; the other rows are untouched (bit for bit), by ``start`` and by
``prefill``.  What each row keeps on the host (the prompt plan, its cursor,
the text detokenizer) is a :class:`~pplex_trio.engine._prompts.PromptRow`,
with the plans and voices it shares in a ``PromptCache``; the tick's tensors
and device work are in :class:`~pplex_trio.engine._device_tick.DeviceTick`.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .._precision import Precision
from ..model import (
    LoadedModel,
    LoadedTranscriber,
    VoiceMaking,
    VoiceNotFoundError,
    lm_dtype_for,
    load_config,
    load_model,
)
from ._device_tick import PASS_POSITIONS, CudaGraphs, DeviceTick
from ._fit import GIB, NotEnoughMemory, auto_slots, out_of_memory_message
from ._fit_transcriber import transcriber_for
from ._interface import Conversation, ConversationRejected, Engine, Job, SlotMode, StepOutput
from ._prompts import PromptCache, PromptRow
from ._transcribing import EngineTranscriber

logger = logging.getLogger(__name__)


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
    tick has been warmed up (CUDA's lazy set-up paid) and, on a CUDA device
    (``cuda_graph=None``, the default; ``True`` insists, ``False`` never),
    recorded as a CUDA graph that every tick replays (see
    :class:`~pplex_trio.engine._device_tick.DeviceTick`): one graph for every mix
    of IDLE and LIVE rows, since rows that do not execute are masked, not
    skipped.  It therefore always runs the sampling code, which the eager
    path skips when every LIVE row is greedy; the results are the same.  A
    capture that fails, or whose replay does not give the eager tick's
    output, leaves the engine eager (:attr:`tick_path` says which).
    Prompts run eagerly (:meth:`prefill`), outside the graph.

    ``compile=True`` runs the tick through ``torch.compile`` (compiled at
    load; on CUDA the graph records the compiled tick), kept only if its
    first ticks give the eager tick's tokens (``tick_path`` ``compiled`` or
    ``compiled_cuda_graph``; else ``eager_after_failed_check`` and one ERROR
    line).  Off by default: compiling adds to the load (80-150 s for the
    small golden model on a CPU), and its floats are not the eager tick's
    bit for bit (docs/BENCHMARKS.md).

    ``transcriber``: the caller's words too, on the same Mimi encode (``_transcribing.py``), in
    :class:`StepOutput`; PersonaPlex's tokens are the same with it or without.

    Error handling: ``ValueError`` for ``cuda_graph=True`` on a model that
    is not on a CUDA device, or a transcriber whose Mimi is not the model's.
    """

    def __init__(
        self,
        model: LoadedModel,
        num_slots: int,
        *,
        default_voice: str | None = None,
        depformer_steps: int | None = None,
        cuda_graph: bool | None = None,
        compile: bool = False,
        transcriber: LoadedTranscriber | None = None,
    ):
        if num_slots < 1:
            raise ValueError("num_slots must be at least 1")
        if cuda_graph is None:
            cuda_graph = model.device.type == "cuda"
        graphs = CudaGraphs(model.device) if cuda_graph else None
        self.model = model
        self.num_slots = num_slots
        self.device = model.device
        cfg = model.config
        self._cfg = cfg
        model.voices.make_recordings()  # voices given as audio are made now, not at a conversation's start
        names = model.voices.names()
        if default_voice is None:
            default_voice = names[0] if names else ""
        elif default_voice and default_voice not in names:
            raise ValueError(
                f"default voice {default_voice!r} is not in the voice library ({', '.join(names) or 'empty'})"
            )
        self.default_voice = default_voice or None
        self._rows = [PromptRow() for _ in range(num_slots)]
        self.last_tokens = np.full((num_slots, cfg.lm.num_streams), -2, dtype=np.int64)
        self._prompts = PromptCache(model)
        self.transcriber = None if transcriber is None else EngineTranscriber(transcriber, num_slots)
        self.last_heard: list[int] = [-2] * num_slots  # the transcriber's last tokens (-2: none)
        self._tick = DeviceTick(
            model, num_slots, depformer_steps=depformer_steps, compile=compile, transcriber=self.transcriber
        )
        self._tick.prepare(graphs)

    @classmethod
    def load(
        cls,
        source: str,
        num_slots: int | None,
        device: str = "cpu",
        voice_dir: str | None = None,
        cuda_graph: bool | None = None,
        memory_reserve: int = 2 * GIB,
        precision: Precision = Precision(),
        transcribe: str | None = None,
        transcribe_required: bool = True,
        **kwargs: Any,
    ) -> PersonaPlexEngine:
        """Load ``source`` (``tiny``, a Hugging Face repo id or a local folder) and build an engine.

        ``num_slots=None`` sizes the batch to the device: as many
        conversations as fit its free memory once the weights are loaded,
        less ``memory_reserve`` bytes (:func:`~pplex_trio.engine._fit.auto_slots`).
        On CPU with a small model, torch is limited to one intra-op thread:
        tiny ops gain nothing from threads, and on a busy machine each
        multi-threaded op can stall for tens of milliseconds.
        ``cuda_graph``: None records the tick as a CUDA graph on a CUDA device; True needs one (checked before
        loading); False never records.
        ``precision``: int8 weights and an fp8 KV cache (:func:`~pplex_trio.model.load_model`).
        ``transcribe``: a transcriber beside it (``tiny-stt``, a repo id, a folder): see ``transcriber_for``.

        Error handling: :class:`~pplex_trio.engine._fit.NotEnoughMemory` (one
        line with the figures and the way out) when the device runs out of
        memory loading the weights, building the batch or capturing the graph.
        """
        if cuda_graph:
            CudaGraphs(torch.device(device))  # refuses a device without CUDA, before loading gigabytes
        doing = "loading the weights"
        try:
            model = load_model(source, device=device, voice_dir=voice_dir, precision=precision)
            if model.device.type == "cpu" and model.config.lm.dim <= 1024 and torch.get_num_threads() > 1:
                logger.info("small model on CPU: using one torch thread")
                torch.set_num_threads(1)
            steps, extra = kwargs.get("depformer_steps"), 0
            if transcribe is not None:
                doing = "loading the transcriber"
                kwargs["transcriber"], extra = transcriber_for(
                    transcribe, model, required=transcribe_required, reserve=memory_reserve, depformer_steps=steps
                )
            if num_slots is None:
                num_slots = auto_slots(model, memory_reserve, depformer_steps=steps, extra=extra)
            doing = (
                "building the engine"
                if cuda_graph is False or model.device.type != "cuda"
                else "building the engine and capturing its tick"
            )
            return cls(model, num_slots, cuda_graph=cuda_graph, **kwargs)
        except torch.OutOfMemoryError:
            where = torch.device(device)
            raise NotEnoughMemory(
                out_of_memory_message(doing, load_config(source), lm_dtype_for(where), where, num_slots, precision)
            ) from None

    # --- Engine interface ---------------------------------------------------------

    @property
    def name(self) -> str:
        return self._cfg.name

    @property
    def tick_path(self) -> str:
        return str(self._tick.path)

    @property
    def transcript_delay(self) -> float | None:
        return None if self.transcriber is None else self.transcriber.delay_s

    def voices(self) -> Sequence[str]:
        return self.model.voices.names()

    def device_memory(self) -> dict[str, int] | None:
        if self.device.type != "cuda":
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        return {
            "allocated": torch.cuda.memory_allocated(self.device),
            "reserved": torch.cuda.memory_reserved(self.device),
            "free": free,
            "total": total,
        }

    def make_voice(self, pcm: np.ndarray) -> Job:
        p = self._cfg.prompt
        return _DeviceJob(VoiceMaking(self.model.lm, self.model.mimi, pcm, p.sine_tokens, p.zero_text_code), self._tick)

    def use_voice_store(self, folder: pathlib.Path) -> None:
        self.model.voices.added = folder

    def start(self, slot: int, conversation: Conversation) -> int:
        """Reset row ``slot`` and plan its system prompt; returns the prompt positions :meth:`prefill` must run.

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
            plan = self._prompts.plan(voice_name, conversation.persona)
        except (VoiceNotFoundError, ValueError) as exc:
            raise ConversationRejected(str(exc)) from exc
        s = conversation.sampling
        tick = self._tick
        with tick.on_device():
            self._reset_row(slot)
            tick.gen.set_cache(
                slot,
                torch.from_numpy(plan.cache_tokens).to(self.device),
                torch.from_numpy(plan.cache_provided).to(self.device),
                plan.offset,
            )
            tick.sampling.set_row(slot, s)
            tick.noise.seed(slot, s.text_seed, s.audio_seed)
            inputs = torch.from_numpy(plan.inputs).to(self.device)
            if plan.voice is not None:
                self._prompts.device_voice(plan.voice)
        self._rows[slot] = PromptRow(
            plan=plan,
            inputs=inputs,
            decoder=self.model.tokenizer.decoder(),
            greedy=s.greedy or (s.text_temperature <= 0 and s.audio_temperature <= 0),
        )
        if self.transcriber is not None:
            self.transcriber.start_row(slot)
        return plan.num_steps

    def prefill(self, work: Mapping[int, int]) -> dict[int, int]:
        """Run up to ``work[slot]`` positions of each slot's system prompt; returns how many each ran.

        The rows go together, a chunk of each per pass (at most
        :data:`PASS_POSITIONS` positions in a pass, fewer where the ring would
        wrap inside a chunk); no other row is touched.  A row whose prompt is
        done may go LIVE.
        """
        done = {slot: 0 for slot in work}
        left = {slot: min(n, self._rows[slot].prompt_left) for slot, n in work.items()}
        with self._tick.on_device(), torch.no_grad():
            while any(left.values()):
                rows = [slot for slot, n in left.items() if n > 0][:PASS_POSITIONS]
                width = max(1, PASS_POSITIONS // len(rows))
                starts = [self._rows[slot].cursor for slot in rows]
                counts = [
                    self._tick.gen.prefill_limit(start, min(left[slot], width))
                    for slot, start in zip(rows, starts, strict=True)
                ]
                self._prefill_chunk(rows, starts, counts)
                for slot, count in zip(rows, counts, strict=True):
                    self._rows[slot].cursor += count
                    left[slot] -= count
                    done[slot] += count
        return done

    def prompt_left(self, slot: int) -> int:
        """Prompt positions row ``slot`` still has to run before it can go LIVE."""
        return self._rows[slot].prompt_left

    def reset(self, slot: int) -> None:
        self._check_slot(slot)
        with self._tick.on_device():
            self._reset_row(slot)
        self._rows[slot] = PromptRow()
        if self.transcriber is not None:
            self.transcriber.end_row(slot)

    def reset_all(self) -> None:
        with self._tick.on_device():
            self._tick.reset_all()
        self._rows = [PromptRow() for _ in range(self.num_slots)]
        if self.transcriber is not None:
            self.transcriber.end_all()

    @torch.no_grad()
    def step(self, modes: Sequence[SlotMode], pcm: np.ndarray) -> StepOutput:
        if len(modes) != self.num_slots:
            raise ValueError(f"expected {self.num_slots} modes, got {len(modes)}")
        live_rows = [i for i, m in enumerate(modes) if m == SlotMode.LIVE]
        for i in live_rows:
            if self._rows[i].prompt_left:
                raise RuntimeError(
                    f"slot {i} is LIVE with {self._rows[i].prompt_left} prompt steps to run: "
                    "call start(), then prefill() until none is left"
                )
        b = self.num_slots
        if not live_rows:
            self.last_tokens = np.full_like(self.last_tokens, -2)
            return StepOutput(pcm=np.zeros((b, self.frame_size), dtype=np.float32), text=[None] * b)
        with self._tick.on_device():
            host, failed = self._step(live_rows, pcm)
        tokens, valid, pcm_out = self._tick.unpack(host)
        self.last_tokens = tokens
        text: list[str | None] = [None] * b
        for i in live_rows:
            row = self._rows[i]
            if valid[i] and row.decoder is not None:
                text[i] = row.decoder.push(int(tokens[i, 0]))
        if self.transcriber is None:
            return StepOutput(pcm=pcm_out, text=text)
        heard, heard_valid, turn = self._tick.unpack_heard(host)
        self.last_heard = [t if ok else -2 for t, ok in zip(heard, heard_valid, strict=True)]
        heard_text, end_of_turn = self.transcriber.pieces(live_rows, heard, heard_valid, turn, b)
        return StepOutput(pcm_out, text, heard_text, end_of_turn, transcriber_failed=failed)

    def _step(self, live_rows: list[int], pcm: np.ndarray) -> tuple[np.ndarray, bool]:
        tick = self._tick
        # What the device needs from the host this tick: the LIVE flags and the input audio, both
        # copied over before any kernel is queued.
        live = tick.host_live.numpy()
        live[:] = 0
        live[live_rows] = 1
        np.copyto(tick.host_pcm.numpy(), pcm, casting="same_kind")
        tick.upload()
        failed = False
        if not tick.replay():  # else the recorded graph ran: every part, every row
            # Eagerly, the sampling noise is drawn only when a LIVE row samples (greedy rows never read it).
            tick.run(sample=any(not self._rows[i].greedy for i in live_rows), listen=False)
            # Apart: the transcriber's failure costs this tick's words, never the conversation.
            failed = self.transcriber is not None and self.transcriber.step_guarded(
                tick.live.bool(), tick.heard_columns
            )
        return tick.download(), failed  # the tick's one read back to the host

    # --- helpers ------------------------------------------------------------------

    def _prefill_chunk(self, rows: list[int], starts: list[int], counts: list[int]) -> None:
        """One pass: row ``rows[j]`` runs prompt steps ``starts[j] .. + counts[j]`` (padded to the longest)."""
        inputs, voice, mask = self._prompts.chunk_inputs([self._rows[slot] for slot in rows], starts, counts)
        self._tick.gen.prefill(rows, starts, counts, inputs, voice, mask)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} out of range 0..{self.num_slots - 1}")

    def _reset_row(self, slot: int) -> None:
        mask = torch.zeros(self.num_slots, dtype=torch.bool)
        mask[slot] = True
        self._tick.reset_rows(mask.to(self.device))


class _DeviceJob:
    """A voice being made, its frames run on the engine's device and stream, like every engine call."""

    def __init__(self, making: VoiceMaking, tick: DeviceTick):
        self._making, self._tick = making, tick

    @property
    def frames_left(self) -> int:
        return self._making.frames_left

    def advance(self, frames: int) -> None:
        with self._tick.on_device():
            self._making.advance(frames)

    def result(self) -> bytes:
        return self._making.result()
