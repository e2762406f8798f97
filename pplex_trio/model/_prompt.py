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

Every token of the prompt is given, so what the model reads at each step
does not depend on the model: the plan runs the token cache's rules once,
on the host (those of :class:`~pplex_trio.model._lockstep.CacheRules`), and keeps
each step's input frame and the cache after the last step.  That is what
lets the engine run a prompt as a few chunks of many positions (the
transformer's ``prefill``) instead of one LM step per position.

Models without system prompts (Kyutai's Moshi, ``PromptConfig.enabled``
False) get an empty plan: the conversation starts at once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._config import LMConfig, ModelConfig
from ._lockstep import CacheRules
from ._text import TextTokenizer, persona_tokens
from ._voices import VoicePrompt


@dataclasses.dataclass(frozen=True)
class PromptPlan:
    """Forced tokens ``[steps, K]`` of every prompt step; the first ``voice_steps`` use the voice.

    ``inputs`` ``[steps, K]``: the frame each step's model reads (a voice
    step reads the voice's embedding instead); ``cache_tokens`` /
    ``cache_provided`` ``[K, slots]`` and ``offset``: the row's token cache
    after the last step.
    """

    tokens: np.ndarray
    voice: VoicePrompt | None
    persona_tokens: tuple[int, ...]
    inputs: np.ndarray
    cache_tokens: np.ndarray
    cache_provided: np.ndarray
    offset: int

    @property
    def num_steps(self) -> int:
        """Prompt steps in all: voice steps, then the silences and persona tokens."""
        return self.tokens.shape[0]

    @property
    def voice_steps(self) -> int:
        """Leading steps that read the voice's stored embeddings (0 without a voice)."""
        return self.voice.num_steps if self.voice is not None else 0


def build_prompt_plan(
    cfg: ModelConfig, tokenizer: TextTokenizer, persona: str, voice: VoicePrompt | None
) -> PromptPlan:
    """Plan the system prompt of one conversation (voice, silences, persona) for ``cfg``; ``ValueError`` if the voice or
    the prompt tokens were made for another model.
    """
    lm, p = cfg.lm, cfg.prompt
    if not p.enabled:
        return _with_cache_run(lm, np.zeros((0, lm.num_streams), dtype=np.int64), None, ())
    n_agent = lm.num_agent_codebooks
    if len(p.silence_tokens) != n_agent or len(p.sine_tokens) != lm.n_q - n_agent:
        raise ValueError("the prompt's silence/sine tokens do not match the model's codebooks")
    rows: list[list[int]] = []
    if voice is not None:
        if voice.embeddings.shape[1] != lm.dim or tuple(voice.cache.shape[1:]) != (lm.num_streams, lm.max_delay + 3):
            raise ValueError(
                f"voice {voice.name} was made for another model "
                f"(embeddings {tuple(voice.embeddings.shape)}, cache {tuple(voice.cache.shape)})"
            )
        rows += [[p.zero_text_code] + [lm.card] * lm.n_q] * voice.num_steps
    agent_user = list(p.silence_tokens) + list(p.sine_tokens)
    silence = [[p.zero_text_code] + agent_user] * p.silence_frames
    persona_ids = persona_tokens(tokenizer, persona, p.wrap_template)
    rows += silence + [[t] + agent_user for t in persona_ids] + silence
    if voice is None and rows:
        rows = rows[1:]
    tokens = np.array(rows, dtype=np.int64).reshape(-1, lm.num_streams)
    return _with_cache_run(lm, tokens, voice, tuple(persona_ids))


def _with_cache_run(
    lm: LMConfig, tokens: np.ndarray, voice: VoicePrompt | None, persona: tuple[int, ...]
) -> PromptPlan:
    """The plan with what its steps read: the token cache's rules, run on the host for one row.

    These are :class:`~pplex_trio.model._lockstep.CacheRules`' ``begin`` and
    ``end`` for one row whose every token is forced (so nothing is sampled
    into the cache), in numpy: the torch version's dozens of tiny ops per step
    cost ~0.4 ms a step on the host, this ~20 us.  ``tests/model/test_prefill.py``
    checks that the two read the same frames.
    """
    rules = CacheRules.of(lm, lm.dep_q, "cpu")
    delays, shift, initial = rules.delays.numpy(), rules.write_shift.numpy(), rules.initial.numpy()
    k, slots = delays.shape[0], rules.slots
    streams = np.arange(k)
    cache = np.repeat(initial[:, None], slots, axis=1)
    provided = np.zeros((k, slots), dtype=bool)
    voice_steps = voice.num_steps if voice is not None else 0
    inputs = np.zeros_like(tokens)
    for i, row in enumerate(tokens):
        offset = i + 1
        write_at = offset + shift
        forced = (row >= 0) & (write_at > delays)
        cache[streams[forced], write_at[forced] % slots] = row[forced]
        provided[streams[forced], write_at[forced] % slots] = True
        warm = offset <= delays
        cache[warm, offset % slots] = initial[warm]
        provided[warm, offset % slots] = True
        inputs[i] = cache[:, (offset - 1) % slots]
        provided[:, (offset - 1) % slots] = False  # the input frame's flags are spent
        if voice is not None and i == voice_steps - 1:
            cache = voice.cache[0].numpy().copy()
    return PromptPlan(
        tokens=tokens,
        voice=voice,
        persona_tokens=persona,
        inputs=inputs,
        cache_tokens=cache,
        cache_provided=provided,
        offset=len(tokens) + 1,
    )
