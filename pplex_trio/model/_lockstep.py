"""The lockstep token cache and the LM step that drives it (PersonaPlex's ``LMGen``).

The 17 streams of a frame are not aligned in time: acoustic codebooks are
delayed by one frame (``delays``).  A small ring of frames per row (the
*token cache*, ``max_delay + 3`` slots, the layout of the voice-prompt
``.pt`` files) holds the tokens in model time.  At LM offset ``o``:

1. tokens forced by the caller for this step are written at ``o + delay``
   and marked *provided* (the user's streams under Kyutai's timing: at
   ``o - 1 + delay``, see below); frames up to a stream's delay hold its
   initial token and are never forced;
2. the model input is the frame at ``o - 1``, the target frame is ``o``;
3. the text token is sampled, then the depformer samples the audio
   codebooks; at each step the token fed forward is the provided one when
   there is one (teacher forcing), the sampled one otherwise;
4. sampled tokens are written at ``o`` where nothing was provided;
5. the output is the de-delayed frame: stream ``k`` read at
   ``o - max_delay + delay[k]`` (text and agent codebook 0 chosen one step
   earlier, the acoustic codebooks now), valid once ``o > max_delay``.

This is NVIDIA's semantics.  Its first call after a reset only
initialises the cache; a row reset here is left as the reference leaves
it after that call (offset 1, initial tokens), so our call ``n`` is the
reference's call ``n + 1``.

The user's timing depends on ``LMConfig.reference``:

* ``"personaplex"``: the user's frame given at a call is that call's
  *target* frame, only *input* to the model at the next call.  Our call
  ``n`` with user frames ``u_0..u_n`` equals Kyutai 0.2.13's call ``n``
  with ``u_{n-1}``.
* ``"kyutai"``: the user's streams are written one frame earlier, on the
  frame this very call reads as input, exactly where Kyutai's ``LMGen``
  writes them (80 ms less latency).  Our call ``n`` with ``u_n`` equals
  Kyutai 0.2.13's call ``n`` with ``u_n``; its first call's user frame
  lands in the initial frame, which both ignore.

Everything else (the agent's streams, the output frame) is the same under
both.  Forced tokens are how the system prompt is replayed (text, agent
and user streams all forced) and how the user's audio enters (user
streams forced).
"""

from __future__ import annotations

import dataclasses

import torch

from ._config import LMConfig
from ._lm import LMModel
from ._sampling import RowSampling, choose
from ._streaming import reset_rows_, set_rows_, where_rows

FREE = -1
"""Marker for "not forced: let the model choose" in :attr:`StepInputs.tokens`."""

UNGENERATED = -2
"""Value of output tokens that do not exist yet (the first step after a reset)."""


@dataclasses.dataclass
class StepInputs:
    """What every row feeds into one LM step (tensors on the model's device).

    ``tokens`` ``[B, K]``: the token forced on each stream, or :data:`FREE`.
    ``embeddings`` ``[B, dim]`` replaces the summed input embedding on rows
    where ``embed_mask`` is set (voice-prompt replay).  ``restore_cache``
    ``[B or 1, K, slots]`` replaces the token cache of the ``restore_mask``
    rows after the step (end of the voice prompt).  Rows where ``exec_mask``
    is False do not move at all.
    """

    tokens: torch.Tensor
    exec_mask: torch.Tensor
    embeddings: torch.Tensor | None = None
    embed_mask: torch.Tensor | None = None
    restore_cache: torch.Tensor | None = None
    restore_mask: torch.Tensor | None = None


@dataclasses.dataclass
class StepResult:
    """What one LM step gives back for every row; the logits and embeddings only when the caller asked for them."""

    tokens: torch.Tensor  # [B, K] de-delayed frame; UNGENERATED where not valid
    valid: torch.Tensor  # [B] bool
    hidden: torch.Tensor  # [B, dim] temporal transformer output (after out_norm)
    text_logits: torch.Tensor | None = None  # [B, text_card] when asked
    audio_logits: torch.Tensor | None = None  # [B, steps, card] when asked
    embeddings: torch.Tensor | None = None  # [B, dim] the input embedding, when asked


@dataclasses.dataclass
class TokenCache:
    """Per-row ring of delayed token frames, with which tokens were forced and each row's LM offset."""

    tokens: torch.Tensor  # [B, K, slots] long
    provided: torch.Tensor  # [B, K, slots] bool
    offset: torch.Tensor  # [B] long: LM offset of the next step
    initial: torch.Tensor  # [K] initial token per stream

    def reset(self, mask: torch.Tensor) -> None:
        """Put the rows selected by ``mask`` [B] back to fresh, in place: initial tokens, nothing forced, offset 1."""
        reset_rows_(self.tokens, mask, self.initial[None, :, None].expand_as(self.tokens))
        reset_rows_(self.provided, mask, False)
        reset_rows_(self.offset, mask, 1)


def _gather(t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``t[b, k, pos[b, k]]`` for ``t`` ``[B, K, S]`` and ``pos`` ``[B, K]``."""
    return t.gather(2, pos.unsqueeze(-1)).squeeze(-1)


def _scatter(t: torch.Tensor, pos: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
    """In place: ``t[b, k, pos[b, k]] = value[b, k]`` where ``mask[b, k]``."""
    old = _gather(t, pos)
    t.scatter_(2, pos.unsqueeze(-1), torch.where(mask, value, old).unsqueeze(-1))


def _mark(flags: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> None:
    """In place: ``flags[b, k, pos[b, k]] = True`` where ``mask[b, k]``."""
    flags.scatter_(2, pos.unsqueeze(-1), (_gather(flags, pos) | mask).unsqueeze(-1))


@dataclasses.dataclass
class CacheFrame:
    """Where one step reads and writes in the token cache: the input frame ``o - 1``, the target ``o``."""

    prev: torch.Tensor  # [B, K] slot of frame o - 1
    cur: torch.Tensor  # [B, K] slot of frame o
    model_input: torch.Tensor  # [B, K] tokens of frame o - 1: what the model reads
    target: torch.Tensor  # [B, K] tokens already at frame o
    provided: torch.Tensor  # [B, K] bool: which of those were forced (teacher forcing)


@dataclasses.dataclass(frozen=True)
class CacheRules:
    """How tokens move through the token cache, the same for every row (steps 1, 4 and 5 of the
    module docstring).  :class:`LMGen` applies them on the model's device; the system prompt's
    planning applies them on the host (:func:`~pplex_trio.model._prompt.build_prompt_plan`)."""

    delays: torch.Tensor  # [K]
    write_shift: torch.Tensor  # [K] where forced tokens land, relative to the target frame
    initial: torch.Tensor  # [K]
    generated: torch.Tensor  # [K] bool: the streams a step samples (text + the depformer's)
    slots: int
    max_delay: int

    @classmethod
    def of(cls, cfg: LMConfig, depformer_steps: int, device: torch.device | str) -> CacheRules:
        """The rules for ``cfg`` (delays, the reference's user timing) with ``depformer_steps`` generated codebooks, on
        ``device``.
        """
        k = cfg.num_streams
        delays = torch.tensor(cfg.delays, device=device)
        # Each stream's delay, one frame less for the user's streams under Kyutai's timing.
        user_lag = 1 if cfg.reference == "kyutai" else 0
        is_user = torch.arange(k, device=device) > cfg.num_agent_codebooks
        initial = torch.full((k,), cfg.card, dtype=torch.long, device=device)
        initial[0] = cfg.text_card
        generated = torch.zeros(k, dtype=torch.bool, device=device)
        generated[: 1 + depformer_steps] = True
        return cls(
            delays=delays,
            write_shift=delays - user_lag * is_user.long(),
            initial=initial,
            generated=generated,
            slots=cfg.max_delay + 3,
            max_delay=cfg.max_delay,
        )

    def fresh_cache(self, batch_size: int) -> TokenCache:
        """A fresh token cache for ``batch_size`` rows: initial tokens everywhere, nothing forced, offset 1."""
        k, device = self.delays.shape[0], self.delays.device
        return TokenCache(
            tokens=self.initial[None, :, None].expand(batch_size, k, self.slots).clone(),
            provided=torch.zeros(batch_size, k, self.slots, dtype=torch.bool, device=device),
            offset=torch.ones(batch_size, dtype=torch.long, device=device),
            initial=self.initial,
        )

    def begin(self, cache: TokenCache, tokens: torch.Tensor, exec_mask: torch.Tensor) -> CacheFrame:
        """Step 1: forced tokens go to ``o + write_shift``, never into a stream's initial frames (those up
        to its delay), which get the initial token; then the step's input and target frames."""
        b, k = tokens.shape
        o = cache.offset
        write_at = o[:, None] + self.write_shift
        write_pos = write_at % self.slots
        forced = (tokens >= 0) & exec_mask[:, None] & (write_at > self.delays)
        _scatter(cache.tokens, write_pos, tokens, forced)
        _mark(cache.provided, write_pos, forced)
        cur = (o % self.slots)[:, None].expand(b, k)
        warmup = (o[:, None] <= self.delays) & exec_mask[:, None]
        _scatter(cache.tokens, cur, cache.initial.expand(b, -1), warmup)
        _mark(cache.provided, cur, warmup)
        prev = ((o - 1) % self.slots)[:, None].expand_as(cur)
        return CacheFrame(
            prev=prev,
            cur=cur,
            model_input=_gather(cache.tokens, prev),
            target=_gather(cache.tokens, cur),
            provided=_gather(cache.provided, cur),
        )

    def end(
        self,
        cache: TokenCache,
        frame: CacheFrame,
        exec_mask: torch.Tensor,
        chosen: torch.Tensor,
        restore: torch.Tensor | None = None,
        restore_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 4 and 5: ``chosen`` ``[B, K]`` lands where nothing was provided, the input frame's flags
        are spent, the offset moves on, the ``restore_mask`` rows take ``restore``; returns the
        de-delayed output frame and whether it is valid."""
        o = cache.offset
        _scatter(
            cache.provided, frame.prev, torch.zeros_like(frame.provided), exec_mask[:, None].expand_as(frame.provided)
        )
        _scatter(cache.tokens, frame.cur, chosen, exec_mask[:, None] & ~frame.provided & self.generated)
        out = _gather(cache.tokens, (o[:, None] - self.max_delay + self.delays) % self.slots)
        valid = o > self.max_delay
        out = torch.where(valid[:, None], out, torch.full_like(out, UNGENERATED))
        cache.offset.add_(exec_mask)
        if restore is not None and restore_mask is not None:
            set_rows_(cache.tokens, restore_mask & exec_mask, restore)
        return out, valid


class LMGen:
    """Streaming generation for a batch of rows: token cache + LM state + sampling.

    ``depformer_steps`` defaults to the agent codebooks (8): the user
    codebooks' steps are always teacher-forced, their samples never used.
    Pass ``lm.cfg.dep_q`` to run them anyway (parity tests do).
    """

    def __init__(self, lm: LMModel, batch_size: int, depformer_steps: int | None = None):
        cfg = lm.cfg
        self.lm = lm
        self.batch_size = batch_size
        self.depformer_steps = depformer_steps or min(cfg.dep_q, cfg.num_agent_codebooks)
        if not 0 < self.depformer_steps <= cfg.dep_q:
            raise ValueError(f"depformer_steps must be in 1..{cfg.dep_q}")
        self.rules = CacheRules.of(cfg, self.depformer_steps, lm.device)
        self.state = lm.init_state(batch_size)
        self.depformer_cache = lm.init_depformer_cache(batch_size)
        self.cache = self.rules.fresh_cache(batch_size)

    def reset(self, mask: torch.Tensor) -> None:
        """Rows in ``mask`` start a fresh conversation; other rows are untouched."""
        self.state.reset(mask)
        self.cache.reset(mask)

    @torch.no_grad()
    def prefill(
        self,
        rows: list[int],
        starts: list[int],
        counts: list[int],
        inputs: torch.Tensor,
        voice: torch.Tensor | None = None,
        voice_mask: torch.Tensor | None = None,
    ) -> None:
        """A chunk of teacher-forced steps for ``rows``: their input frames ``inputs`` ``[R, T, K]``
        (a ``voice_mask`` ``[R, T]`` position reads ``voice`` ``[R, T, dim]`` instead), at LM positions
        ``starts[r] ..`` (``counts[r]`` of them), into the rows' KV rings.  The token cache is not
        touched: a prompt's whole run is known beforehand (:meth:`set_cache`).  Other rows: untouched."""
        r, t, k = inputs.shape
        x = self.lm.embed(inputs.reshape(r * t, k)).view(r, t, -1)
        if voice is not None and voice_mask is not None:
            x = torch.where(voice_mask[..., None], voice.to(x.dtype), x)
        self.lm.transformer.prefill(x, self.state, rows, starts, counts)

    def prefill_limit(self, start: int, wanted: int) -> int:
        """How many steps from LM position ``start`` one :meth:`prefill` may take (at most ``wanted``)."""
        return self.lm.transformer.prefill_limit(start, wanted)

    def set_cache(self, row: int, tokens: torch.Tensor, provided: torch.Tensor, offset: int) -> None:
        """Row ``row``'s token cache becomes ``tokens`` / ``provided`` ``[K, slots]`` at ``offset``."""
        self.cache.tokens[row] = tokens
        self.cache.provided[row] = provided
        self.cache.offset[row] = offset

    @torch.no_grad()
    def step(
        self,
        inputs: StepInputs,
        sampling: RowSampling | None = None,
        noise: tuple[torch.Tensor, torch.Tensor] | None = None,
        *,
        run_depformer: bool = True,
        return_logits: bool = False,
        return_embeddings: bool = False,
    ) -> StepResult:
        """Advance every executing row by one frame.

        ``sampling``/``noise`` (from :class:`~pplex_trio.model._sampling.RowNoise`)
        select sampling per row; without them every choice is the argmax.
        ``run_depformer=False`` skips the depformer: only allowed when every
        executing row forces all its audio streams (prompt replay), where its
        output would be overwritten anyway.
        """
        lm, cache, exec_mask = self.lm, self.cache, inputs.exec_mask
        frame = self.rules.begin(cache, inputs.tokens, exec_mask)
        target, provided = frame.target, frame.provided

        # 2. Temporal transformer and text.
        x = lm.embed(frame.model_input)
        if inputs.embeddings is not None and inputs.embed_mask is not None:  # as restore_cache/restore_mask
            x = where_rows(inputs.embed_mask, inputs.embeddings.to(x.dtype), x)
        hidden, text_logits = lm.temporal(x, self.state, exec_mask)
        s = sampling if noise is not None else None
        if s is not None and noise is not None:
            text = choose(text_logits, s.text, s.text.gumbel(noise[0]))
            audio_gumbel = s.audio.gumbel(noise[1])  # every step's at once
        else:
            text = text_logits.argmax(-1)

        # 3. Depformer, teacher-forced wherever a token was provided.
        chosen = [text[:, None]]
        logits = []
        if run_depformer:
            previous = torch.where(provided[:, 0], target[:, 0], text)
            for step in range(self.depformer_steps):
                step_logits = lm.depformer_step(hidden, previous, step, self.depformer_cache)
                if s is not None and step < audio_gumbel.shape[1]:
                    token = choose(step_logits, s.audio, audio_gumbel[:, step])
                else:
                    token = step_logits.argmax(-1)
                chosen.append(token[:, None])
                logits.append(step_logits)
                if step + 1 < self.depformer_steps:
                    previous = torch.where(provided[:, 1 + step], target[:, 1 + step], token)

        # 4-5. Sampled tokens land where nothing was provided; the de-delayed output frame.
        sampled = torch.cat([*chosen, target[:, len(chosen) :]], dim=1)
        out, valid = self.rules.end(cache, frame, exec_mask, sampled, inputs.restore_cache, inputs.restore_mask)
        return StepResult(
            tokens=out,
            valid=valid,
            hidden=hidden,
            text_logits=text_logits if return_logits else None,
            audio_logits=torch.stack(logits, dim=1) if return_logits and logits else None,
            embeddings=x if return_embeddings else None,
        )
