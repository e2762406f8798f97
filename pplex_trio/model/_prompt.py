"""The PersonaPlex system prompt, as a list of forced LM steps.

Before a conversation the reference replays, for that conversation only:

1. the voice prompt: one step per stored embedding (text, agent and user
   streams forced to PAD / initial / initial, the input embedding replaced
   by the stored one), then the token cache is restored from the file;
2. ``silence_frames`` steps of silence: PAD text, agent = silence codes,
   user = sine codes;
3. one step per persona token (``"<system> ... <system>"``): the token on
   the text stream, agent silence, user sine;
4. ``silence_frames`` steps of silence again.

Without a voice prompt the reference's very first call (a silence step)
only initialises its cache and its tokens are lost; our rows start after
that call, so the plan drops that step to stay identical.

Models without system prompts (Kyutai's Moshi, ``PromptConfig.enabled``
False) get an empty plan: the conversation starts at once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._config import ModelConfig
from ._text import TextTokenizer, persona_tokens
from ._voices import VoicePrompt


@dataclasses.dataclass(frozen=True)
class PromptPlan:
    """Forced tokens ``[steps, K]`` of every prompt step; the first ``voice_steps`` use the voice."""

    tokens: np.ndarray
    voice: VoicePrompt | None
    persona_tokens: tuple[int, ...]

    @property
    def num_steps(self) -> int:
        return self.tokens.shape[0]

    @property
    def voice_steps(self) -> int:
        return self.voice.num_steps if self.voice is not None else 0


def build_prompt_plan(cfg: ModelConfig, tokenizer: TextTokenizer, persona: str,
                      voice: VoicePrompt | None) -> PromptPlan:
    lm, p = cfg.lm, cfg.prompt
    if not p.enabled:
        return PromptPlan(tokens=np.zeros((0, lm.num_streams), dtype=np.int64), voice=None, persona_tokens=())
    n_agent = lm.num_agent_codebooks
    if len(p.silence_tokens) != n_agent or len(p.sine_tokens) != lm.n_q - n_agent:
        raise ValueError("the prompt's silence/sine tokens do not match the model's codebooks")
    rows: list[list[int]] = []
    if voice is not None:
        if voice.embeddings.shape[1] != lm.dim or tuple(voice.cache.shape[1:]) != (lm.num_streams, lm.max_delay + 3):
            raise ValueError(f"voice {voice.name} was made for another model "
                             f"(embeddings {tuple(voice.embeddings.shape)}, cache {tuple(voice.cache.shape)})")
        rows += [[p.zero_text_code] + [lm.card] * lm.n_q] * voice.num_steps
    agent_user = list(p.silence_tokens) + list(p.sine_tokens)
    silence = [[p.zero_text_code] + agent_user] * p.silence_frames
    persona = persona_tokens(tokenizer, persona, p.wrap_template)
    rows += silence + [[t] + agent_user for t in persona] + silence
    if voice is None and rows:
        rows = rows[1:]
    tokens = np.array(rows, dtype=np.int64).reshape(-1, lm.num_streams)
    return PromptPlan(tokens=tokens, voice=voice, persona_tokens=tuple(persona))
