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
(persona, voice, sampling settings and seeds, text detokenizer) lives in
this object; the tensors live in the model package's state objects.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
import torch

from ..model import (FREE, LMGen, LoadedModel, PromptPlan, RowGenerators, RowSampling, StepInputs, StreamDecoder,
                     VoiceNotFoundError, build_prompt_plan, load_model)
from ._interface import Conversation, ConversationRejected, Engine, SlotMode, StepOutput

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
    """

    def __init__(self, model: LoadedModel, num_slots: int, *, default_voice: str | None = None,
                 depformer_steps: int | None = None):
        if num_slots < 1:
            raise ValueError("num_slots must be at least 1")
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
        self._rows = [_Row() for _ in range(num_slots)]
        self.last_tokens = np.full((num_slots, cfg.lm.num_streams), -2, dtype=np.int64)
        self._build_state()

    @classmethod
    def load(cls, source: str, num_slots: int, device: str = "cpu", voice_dir: str | None = None,
             **kwargs) -> "PersonaPlexEngine":
        """Load ``source`` (``tiny``, a Hugging Face repo id or a local folder) and build an engine.

        On CPU with a small model, torch is limited to one intra-op thread:
        tiny ops gain nothing from threads, and on a busy machine each
        multi-threaded op can stall for tens of milliseconds.
        """
        model = load_model(source, device=device, voice_dir=voice_dir)
        if model.device.type == "cpu" and model.config.lm.dim <= 1024 and torch.get_num_threads() > 1:
            logger.info("small model on CPU: using one torch thread")
            torch.set_num_threads(1)
        return cls(model, num_slots, **kwargs)

    def _build_state(self) -> None:
        b, lm, dev = self.num_slots, self.model.lm, self.device
        self._gen = LMGen(lm, b, depformer_steps=self._depformer_steps)
        self._enc = self.model.mimi.init_encoder_state(b)
        self._dec = self.model.mimi.init_decoder_state(b)
        self._sampling = RowSampling.greedy_rows(b, dev)
        self._random = RowGenerators(b, lm.cfg.text_card, self._gen.depformer_steps, lm.cfg.card, dev)
        self._voice_emb = torch.zeros(b, 1, lm.cfg.dim, device=dev, dtype=lm.dtype)
        self._voice_cache = self._gen.cache.tokens.clone()

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
            self._store_voice(slot, voice)
        s = conversation.sampling
        self._sampling.set_row(slot, s)
        self._random.seed(slot, s.text_seed, s.audio_seed)
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
        b, cfg, dev = self.num_slots, self._cfg.lm, self.device
        if len(modes) != b:
            raise ValueError(f"expected {b} modes, got {len(modes)}")
        live_rows = [i for i, m in enumerate(modes) if m == SlotMode.LIVE]
        prefill_rows = [i for i, m in enumerate(modes) if m == SlotMode.PREFILL]
        # Everything the device needs from the host this tick goes over in two copies, before any
        # kernel is queued, so no copy waits for the GPU.
        k = cfg.num_streams
        host = np.zeros((b, k + 5), dtype=np.int64)  # forced tokens, voice step, 4 row flags
        host[:, :k] = FREE
        for i in prefill_rows:
            row = self._rows[i]
            if row.plan is None or row.cursor >= row.plan.num_steps:
                raise RuntimeError(f"slot {i} is PREFILL but has no prompt step left: call start() first")
            host[i, :k] = row.plan.tokens[row.cursor]
            if row.cursor < row.plan.voice_steps:
                host[i, k] = row.cursor
                host[i, k + 3] = 1
                host[i, k + 4] = row.cursor == row.plan.voice_steps - 1
        host[live_rows, k + 1] = 1
        host[live_rows + prefill_rows, k + 2] = 1
        on_device = torch.from_numpy(host).to(dev)
        if live_rows:
            frames = torch.from_numpy(np.ascontiguousarray(pcm, dtype=np.float32)).to(dev)
        tokens, voice_step = on_device[:, :k], on_device[:, k]
        live, exec_mask, embed_mask, restore_mask = (on_device[:, k + j].bool() for j in range(1, 5))
        if live_rows:
            codes = self.model.mimi.encode_frame(frames, self._enc, live)
            user = slice(1 + cfg.num_agent_codebooks, None)
            tokens[:, user] = torch.where(live[:, None], codes, tokens[:, user])
        inputs = StepInputs(tokens=tokens, exec_mask=exec_mask)
        if any(self._rows[i].cursor < self._rows[i].plan.voice_steps for i in prefill_rows):
            inputs.embeddings = self._voice_emb[torch.arange(b, device=dev), voice_step]
            inputs.embed_mask = embed_mask
            inputs.restore_cache = self._voice_cache
            inputs.restore_mask = restore_mask
        sampled_rows = [i for i in live_rows if not self._rows[i].greedy]
        noise = self._random.draw(sampled_rows) if sampled_rows else None
        result = self._gen.step(inputs, self._sampling, noise, run_depformer=bool(live_rows))

        out_pcm = None
        if live_rows:
            # Only frames that exist are decoded (see the class docstring); the others stay silent.
            agent = result.tokens[:, 1: 1 + cfg.num_agent_codebooks]
            speak = live & ((agent >= 0) & (agent < cfg.card)).all(1)
            out_pcm = self.model.mimi.decode_frame(agent.clamp(0, cfg.card - 1), self._dec, speak)
            out_pcm = torch.where(speak[:, None], out_pcm, 0.0)
        # The one read back to the host per tick.
        self.last_tokens = result.tokens.cpu().numpy()
        pcm_out = np.zeros((b, self.frame_size), dtype=np.float32)
        if out_pcm is not None:
            pcm_out[live_rows] = out_pcm.float().cpu().numpy()[live_rows]
        valid = result.valid.cpu().numpy()
        text: list[str | None] = [None] * b
        for i in prefill_rows:
            self._rows[i].cursor += 1
        for i in live_rows:
            row = self._rows[i]
            if row.plan is not None:
                row.cursor = row.plan.num_steps
            if valid[i] and row.decoder is not None:
                text[i] = row.decoder.push(int(self.last_tokens[i, 0]))
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
        mask = self._mask([slot])
        self._gen.reset(mask)
        self._enc.reset(mask)
        self._dec.reset(mask)

    def _store_voice(self, slot: int, voice) -> None:
        steps = voice.num_steps
        if steps > self._voice_emb.shape[1]:  # grow the buffer (rare: a longer voice than any before)
            grown = torch.zeros(self.num_slots, steps, self._voice_emb.shape[2],
                                device=self.device, dtype=self._voice_emb.dtype)
            grown[:, : self._voice_emb.shape[1]] = self._voice_emb
            self._voice_emb = grown
        self._voice_emb[slot, :steps] = voice.embeddings.to(self.device, self._voice_emb.dtype)
        self._voice_cache[slot] = voice.cache[0].to(self.device)
