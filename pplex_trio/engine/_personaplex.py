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

from ..model import FREE, LoadedModel, PromptPlan, StreamDecoder, VoiceNotFoundError, build_prompt_plan, load_model
from ._interface import Conversation, ConversationRejected, Engine, SlotMode, StepOutput
from ._tick import EMBED, EXEC, LIVE, RESTORE, VOICE_STEP, DeviceTick

logger = logging.getLogger(__name__)


def _check_cuda_graph_device(device: torch.device) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"cuda_graph=True needs the model on a CUDA device, not {device} "
                         f"(CUDA available here: {torch.cuda.is_available()}): use device='cuda' "
                         "or leave cuda_graph off")


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

    ``cuda_graph=True`` (CUDA only, off by default) records each tick's
    device work once as a CUDA graph and replays it (see
    :class:`~pplex_trio.engine._tick.DeviceTick`): one graph for every mix
    of IDLE, PREFILL and LIVE rows, since rows that do not execute are
    masked, not skipped.  It therefore always runs Mimi, the depformer and
    the sampling code, which the eager path skips on ticks that do not
    need them (e.g. prompt-only ticks); the results are the same.  **The
    CUDA graph path is untested on hardware**: the CPU tests check what it
    relies on (static buffers, no host reads in the tick, same results with
    every part on), not the capture or the replay.

    Error handling: ``ValueError`` for ``cuda_graph=True`` on a model that
    is not on a CUDA device.
    """

    def __init__(self, model: LoadedModel, num_slots: int, *, default_voice: str | None = None,
                 depformer_steps: int | None = None, cuda_graph: bool = False):
        if num_slots < 1:
            raise ValueError("num_slots must be at least 1")
        if cuda_graph:
            _check_cuda_graph_device(model.device)
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
        self._depformer_steps = depformer_steps
        self.cuda_graph = cuda_graph
        self._shortcuts = True  # eager ticks skip the parts they do not need (tests turn this off)
        self._rows = [_Row() for _ in range(num_slots)]
        self.last_tokens = np.full((num_slots, cfg.lm.num_streams), -2, dtype=np.int64)
        self._build_state()

    @classmethod
    def load(cls, source: str, num_slots: int, device: str = "cpu", voice_dir: str | None = None,
             cuda_graph: bool = False, **kwargs) -> "PersonaPlexEngine":
        """Load ``source`` (``tiny``, a Hugging Face repo id or a local folder) and build an engine.

        On CPU with a small model, torch is limited to one intra-op thread:
        tiny ops gain nothing from threads, and on a busy machine each
        multi-threaded op can stall for tens of milliseconds.
        ``cuda_graph=True`` needs a CUDA ``device`` (checked before loading).
        """
        if cuda_graph:
            _check_cuda_graph_device(torch.device(device))  # before loading gigabytes
        model = load_model(source, device=device, voice_dir=voice_dir)
        if model.device.type == "cpu" and model.config.lm.dim <= 1024 and torch.get_num_threads() > 1:
            logger.info("small model on CPU: using one torch thread")
            torch.set_num_threads(1)
        return cls(model, num_slots, cuda_graph=cuda_graph, **kwargs)

    def _build_state(self) -> None:
        self._tick = DeviceTick(self.model, self.num_slots, depformer_steps=self._depformer_steps,
                                cuda_graph=self.cuda_graph)

    # --- Engine interface ---------------------------------------------------------

    @property
    def name(self) -> str:
        return self._cfg.name

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
        except (VoiceNotFoundError, ValueError) as exc:
            raise ConversationRejected(str(exc)) from exc
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
        self._reset_row(slot)
        self._rows[slot] = _Row()

    def reset_all(self) -> None:
        self._build_state()
        self._rows = [_Row() for _ in range(self.num_slots)]

    @torch.no_grad()
    def step(self, modes: Sequence[SlotMode], pcm: np.ndarray) -> StepOutput:
        b, cfg, tick = self.num_slots, self._cfg.lm, self._tick
        if len(modes) != b:
            raise ValueError(f"expected {b} modes, got {len(modes)}")
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
        if self.cuda_graph:
            tick.prepare_graph()  # (records on first use; moves no state)
        tick.upload(with_pcm=bool(live_rows))
        sampled_rows = [i for i in live_rows if not self._rows[i].greedy]
        if self.cuda_graph:
            tick.replay()
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
