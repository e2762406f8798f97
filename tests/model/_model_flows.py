"""Flows shared by several model tests (importable as ``_model_flows``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from pplex_trio.engine._device_tick import DeviceTick
from pplex_trio.model import FREE, LMGen, StepInputs, build_prompt_plan


def every_part(engine, on: bool = True) -> None:
    """Make ``engine``'s eager ticks run every part, as ``cuda_graph=True`` records the tick (``on=False`` undoes it).

    The engine draws the sampling noise only when a LIVE row samples; with this it is drawn every tick, so
    a test can show that skipping it changes nothing.
    """
    tick = engine._tick
    if on:
        tick.run = lambda *, sample, listen=True: DeviceTick.run(tick, sample=True, listen=listen)
    else:
        vars(tick).pop("run", None)


@dataclasses.dataclass
class LMRun:
    hidden: np.ndarray  # [steps, dim]
    text_logits: np.ndarray
    audio_logits: np.ndarray  # [steps, depformer_steps, card]
    tokens: np.ndarray  # [steps, 17]
    valid: np.ndarray
    forced: np.ndarray  # the forced tokens we fed


@torch.no_grad()
def run_lm(model, golden, depformer_steps: int) -> LMRun:
    """The golden flow driven directly on the LM (no Mimi): prompt plan, then the input codes."""
    plan = build_prompt_plan(model.config, model.tokenizer, golden.persona, model.voices.get(golden.voice))
    user = np.full((len(golden.input_codes), 17), FREE)
    user[:, 9:] = golden.input_codes
    forced = np.concatenate([plan.tokens, user])
    gen = LMGen(model.lm, 1, depformer_steps=depformer_steps)
    yes = torch.ones(1, dtype=torch.bool)
    out = {k: [] for k in ("hidden", "text_logits", "audio_logits", "tokens", "valid")}
    for i, row in enumerate(forced):
        inputs = StepInputs(tokens=torch.from_numpy(row)[None], exec_mask=yes)
        if i < plan.voice_steps:
            inputs.embeddings = plan.voice.embeddings[i][None]
            inputs.embed_mask = yes
            if i == plan.voice_steps - 1:
                inputs.restore_cache, inputs.restore_mask = plan.voice.cache, yes
        r = gen.step(inputs, return_logits=True)
        for key in out:
            out[key].append(getattr(r, key)[0].numpy())
    return LMRun(**{k: np.stack(v) for k, v in out.items()}, forced=forced)
