"""The host side of the engine's system prompts: each row's prompt, the plans, and the voices on the device.

A conversation's system prompt (voice, silence, persona, silence) is planned
once on the host (:func:`~pplex_trio.model.build_prompt_plan`) and then run
by :meth:`~pplex_trio.engine._personaplex.PersonaPlexEngine.prefill` between
ticks, a chunk of positions at a time.  What that needs between the chunks is
here: each row's plan, its inputs on the device and its cursor
(:class:`PromptRow`); the plans kept by (voice, persona) and each voice's
embeddings copied to the device once (:class:`PromptCache`), and a chunk's
inputs gathered for a pass of the model's ``prefill``.

It stands apart from the engine's tick: nothing here steps the model or
touches the tick's tensors, and a tick never reads a plan; the engine calls
the model's ``prefill`` with what :meth:`PromptCache.chunk_inputs` gathers.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import torch

from ..model import LoadedModel, PromptPlan, StreamDecoder, VoicePrompt, build_prompt_plan

PLANS_KEPT = 64  # prompt plans kept by (voice, persona): most callers share a few


@dataclasses.dataclass
class PromptRow:
    """What the engine keeps on the host for one row: its prompt plan and how far it ran, its text decoder."""

    plan: PromptPlan | None = None
    inputs: torch.Tensor | None = None  # [steps, K] on the device: each prompt step's input frame
    cursor: int = 0  # prompt steps done
    decoder: StreamDecoder | None = None
    greedy: bool = True

    @property
    def prompt_left(self) -> int:
        """Prompt steps still to run (0: none, or no prompt)."""
        return 0 if self.plan is None else self.plan.num_steps - self.cursor


class PromptCache:
    """The prompt plans of one model by (voice, persona), and its voices' embeddings on the device."""

    def __init__(self, model: LoadedModel):
        self.model = model
        self._plans: collections.OrderedDict[tuple[str | None, str], PromptPlan] = collections.OrderedDict()
        self._voice_embeddings: dict[str, tuple[VoicePrompt, torch.Tensor]] = {}  # on the device, LM's dtype

    def plan(self, voice_name: str | None, persona: str) -> PromptPlan:
        """The plan for ``persona`` spoken in ``voice_name`` (None: no voice), built once and kept.

        Error handling: :class:`~pplex_trio.model.VoiceNotFoundError` for a voice not in the
        library, ``ValueError`` for one that cannot be used (as ``build_prompt_plan``).
        """
        key = (voice_name, persona)
        voice = self.model.voices.get(voice_name) if voice_name is not None else None
        plan = self._plans.get(key)
        if plan is None or plan.voice is not voice:  # (a voice deleted and added again is another voice)
            plan = self._plans[key] = build_prompt_plan(self.model.config, self.model.tokenizer, persona, voice)
            if len(self._plans) > PLANS_KEPT:
                self._plans.popitem(last=False)
        self._plans.move_to_end(key)
        return plan

    def device_voice(self, voice: VoicePrompt) -> torch.Tensor:
        """``voice``'s embeddings on the model's device, in the LM's dtype (copied once per voice)."""
        cached = self._voice_embeddings.get(voice.name)
        if cached is None or cached[0] is not voice:  # a voice replaced under its name is copied again
            cached = self._voice_embeddings[voice.name] = (
                voice,
                voice.embeddings.to(self.model.device, self.model.lm.dtype),
            )
        return cached[1]

    def chunk_inputs(
        self, rows: Sequence[PromptRow], starts: list[int], counts: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One pass's inputs: row ``rows[j]`` runs prompt steps ``starts[j] .. + counts[j]`` (padded to the longest).

        Returns the input frames, and the voice embeddings with their mask (both None when no row is in its voice).
        """
        device = self.model.device
        width = max(counts)
        steps = torch.arange(width, device=device)
        inputs: list[torch.Tensor] = []
        voices: list[torch.Tensor | None] = []
        masks: list[torch.Tensor] = []
        for row, start in zip(rows, starts, strict=True):
            assert row.plan is not None and row.inputs is not None
            index = (start + steps).clamp(max=row.plan.num_steps - 1)
            inputs.append(row.inputs[index])
            voice_steps = row.plan.voice_steps
            if voice_steps and start < voice_steps:
                assert row.plan.voice is not None
                voices.append(self.device_voice(row.plan.voice)[index.clamp(max=voice_steps - 1)])
                masks.append(start + steps < voice_steps)
            else:
                voices.append(None)
                masks.append(torch.zeros(width, dtype=torch.bool, device=device))
        voice = mask = None
        if any(v is not None for v in voices):
            zeros = torch.zeros(width, self.model.config.lm.dim, device=device, dtype=self.model.lm.dtype)
            voice = torch.stack([zeros if v is None else v for v in voices])
            mask = torch.stack(masks)
        return torch.stack(inputs), voice, mask
