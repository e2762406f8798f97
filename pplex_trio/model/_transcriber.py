"""The caller's speech in words: Kyutai's streaming speech-to-text, stepped in lockstep with the conversation.

:class:`SpeechToText` holds the weights of a Kyutai STT model (a Moshi LM
with no depformer, :mod:`~pplex_trio.model._stt_config`): one embedding
per audio codebook and one for text, the temporal transformer (ours, with
its ring KV cache), the text head and the extra heads.  Parameter names
are Kyutai's, so the checkpoint loads without renaming.

:class:`Transcriber` steps a batch of rows together, one 80 ms frame per
call, exactly as Kyutai's ``LMGen`` (moshi 0.2.13) does for ``dep_q`` 0:

1. the frame's ``n_q`` codes are written into the row's token cache at
   ``offset + delay`` (per stream);
2. the model reads the cache at ``offset``: its previous text token and
   the audio frames due now; a stream whose delay is not yet reached
   (``offset <= delay``) reads its initial token.  So call 0 of a row sees
   no audio at all (Kyutai's scripts start with silence, or step the first
   frame twice);
3. the text token is the argmax of the text logits (Kyutai's STT
   ``lm_gen_config`` has temperature 0) and goes to ``offset + 1``; the
   extra heads' softmax is read from the same transformer output;
4. the output is the text at ``offset + 1 - max_delay``, valid once
   ``offset + 1 > max_delay``: with all delays 0 (both published models),
   every call gives the token it just chose.

Rows where ``exec_mask`` is False do not move; ``reset(mask)`` starts the
masked rows afresh (the :class:`~pplex_trio.model._streaming.StreamingState`
protocol), the others untouched bit for bit.  Shapes are static.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from ._streaming import reset_rows_
from ._stt_config import END_OF_TURN_HEAD, END_OF_TURN_INDEX, STTConfig
from ._transformer import StreamingTransformer, TransformerState, make_norm

UNGENERATED = -2
"""Output value of rows with no text this call (not executing, or still within the streams' delay)."""


class SpeechToText(nn.Module):
    """A Kyutai STT model's weights: ``n_q`` audio embeddings, the text embedding, the temporal transformer, the text
    head and the extra heads (the end-of-turn detector)."""

    def __init__(self, cfg: STTConfig):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.ModuleList(nn.Embedding(cfg.card + 1, cfg.dim) for _ in range(cfg.n_q))
        self.text_emb = nn.Embedding(cfg.text_card + 1, cfg.dim)
        self.transformer = StreamingTransformer(cfg.temporal)
        self.out_norm = make_norm(cfg.norm, cfg.dim)
        self.text_linear = nn.Linear(cfg.dim, cfg.text_card, bias=False)
        self.extra_heads = nn.ModuleList(
            nn.Linear(cfg.dim, cfg.extra_heads_dim, bias=False) for _ in range(cfg.extra_heads_num_heads)
        )
        # stacked_embeddings: not buffers (the table's rows are the parameters); the row where each stream starts.
        self._table: torch.Tensor | None = None
        self._starts = torch.zeros(0, dtype=torch.long)

    @property
    def device(self) -> torch.device:
        """The device the weights live on."""
        return self.text_emb.weight.device

    def init_state(self, batch_size: int) -> TransformerState:
        """Fresh KV rings for ``batch_size`` rows."""
        return self.transformer.init_state(batch_size)

    def stacked_embeddings(self) -> torch.Tensor:
        """The text embedding and the ``n_q`` audio ones as one table, in the streams' order: each
        :class:`~torch.nn.Embedding`'s weight is a view of it (no memory added), so :meth:`embed` is one gather.
        Made again when the weights were replaced or moved since (a load, ``.to``)."""
        streams = [self.text_emb, *self.emb]
        table = self._table
        if table is not None and self._table_current(table, [e.weight for e in streams]):
            return table
        with torch.no_grad():
            table = torch.cat([e.weight.detach() for e in streams])
        starts, start = [], 0
        for e in streams:
            rows = len(e.weight)
            e.weight = nn.Parameter(table[start : start + rows], requires_grad=e.weight.requires_grad)
            starts.append(start)
            start += rows
        self._table, self._starts = table, torch.tensor(starts, device=table.device)
        return table

    @staticmethod
    def _table_current(table: torch.Tensor, weights: list[torch.Tensor]) -> bool:
        """Whether ``weights`` are still the rows of ``table``, one after another (metadata only: no kernel)."""
        row = table.stride(0) * table.element_size()
        start = 0
        for w in weights:
            same = w.device == table.device and w.dtype == table.dtype and w.shape[1:] == table.shape[1:]
            if not same or w.data_ptr() != table.data_ptr() + start * row:
                return False
            start += w.shape[0]
        return start == table.shape[0]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Sum of the stream embeddings of ``tokens`` ``[B, 1 + n_q]`` (text first): ``[B, dim]``.

        One gather from :meth:`stacked_embeddings` and one sum over the streams (3 kernels; 65 one stream
        after another).  The sum rounds otherwise than Kyutai's additions one after another (the audio
        codebooks, then the text): a float32 reduction, not 32 roundings to the LM's dtype."""
        table = self.stacked_embeddings()
        return F.embedding(tokens + self._starts, table).sum(1)

    def temporal(
        self, x: torch.Tensor, state: TransformerState, exec_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``x`` ``[B, dim]`` -> (normed output ``[B, dim]``, text logits ``[B, text_card]``)."""
        h = self.out_norm(self.transformer(x.unsqueeze(1), state, exec_mask))[:, 0]
        return h, self.text_linear(h)

    def extra_head_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each extra head's softmax over its classes, from the normed output ``[B, dim]``: float32
        ``[B, heads, extra_heads_dim]`` (``[B, 0, dim]`` without heads)."""
        if not len(self.extra_heads):
            return hidden.new_zeros(hidden.shape[0], 0, self.cfg.extra_heads_dim, dtype=torch.float32)
        return torch.stack([torch.softmax(head(hidden).float(), dim=-1) for head in self.extra_heads], dim=1)


@dataclasses.dataclass
class STTCache:
    """Per-row token frames in model time (``max_delay + 2`` slots) and each row's offset."""

    tokens: torch.Tensor  # [B, 1 + n_q, slots] long
    offset: torch.Tensor  # [B] long: the number of calls the row has executed
    initial: torch.Tensor  # [1 + n_q]: text_card, then card

    def reset(self, mask: torch.Tensor) -> None:
        """The rows selected by ``mask`` [B] back to fresh, in place: offset 0, initial tokens."""
        reset_rows_(self.tokens, mask, self.initial[None, :, None].expand_as(self.tokens))
        reset_rows_(self.offset, mask, 0)


@dataclasses.dataclass
class STTState:
    """Everything a :class:`Transcriber` remembers per row: the KV rings and the token cache."""

    transformer: TransformerState
    cache: STTCache

    def reset(self, mask: torch.Tensor) -> None:
        """Rows in ``mask`` [B] start a fresh transcription; the others are untouched, bit for bit."""
        self.transformer.reset(mask)
        self.cache.reset(mask)


@dataclasses.dataclass
class TranscriptStep:
    """What one :meth:`Transcriber.step` gives back for every row."""

    text: torch.Tensor  # [B] long: the text token, UNGENERATED where not valid
    valid: torch.Tensor  # [B] bool
    extra_heads: torch.Tensor  # [B, heads, extra_heads_dim] float32: each extra head's probabilities
    end_of_turn: torch.Tensor | None  # [B] float32: the end-of-turn probability, None if the model has no such head


class Transcriber:
    """Streaming transcription of ``batch_size`` rows, one Mimi frame (``n_q`` codes) per row and call.

    Greedy, as Kyutai's STT models are run.  ``state`` (:class:`STTState`) is
    the rows' memory; :meth:`reset` restarts rows.  The probabilities of the
    extra heads belong to this call's transformer output (not delayed).
    """

    def __init__(self, model: SpeechToText, batch_size: int):
        cfg = model.cfg
        self.model = model
        self.batch_size = batch_size
        device = model.device
        self.delays = torch.tensor(cfg.delays, device=device)
        self.slots = cfg.max_delay + 2
        initial = torch.full((cfg.num_streams,), cfg.card, dtype=torch.long, device=device)
        initial[0] = cfg.text_card
        cache = STTCache(
            tokens=initial[None, :, None].expand(batch_size, -1, self.slots).clone(),
            offset=torch.zeros(batch_size, dtype=torch.long, device=device),
            initial=initial,
        )
        self.state = STTState(transformer=model.init_state(batch_size), cache=cache)
        model.stacked_embeddings()  # (now, not inside a captured step)

    def reset(self, mask: torch.Tensor) -> None:
        """Rows in ``mask`` [B] start a fresh transcription; other rows are untouched."""
        self.state.reset(mask)

    @torch.no_grad()
    def step(self, codes: torch.Tensor, exec_mask: torch.Tensor | None = None) -> TranscriptStep:
        """Advance the executing rows by one frame: ``codes`` long ``[B, >= n_q]`` (the caller's Mimi codes; levels
        past ``n_q`` are ignored) -> the text token and extra-head probabilities of every row."""
        cfg, cache = self.model.cfg, self.state.cache
        b = codes.shape[0]
        if exec_mask is None:
            exec_mask = torch.ones(b, dtype=torch.bool, device=codes.device)
        o = cache.offset
        rows = torch.arange(b, device=codes.device)
        # 1. The audio streams are written at offset + delay.
        audio = cache.tokens[:, 1:]
        write = (o[:, None] + self.delays[1:]) % self.slots  # [B, n_q]
        old = audio.gather(2, write.unsqueeze(-1)).squeeze(-1)
        new = torch.where(exec_mask[:, None], codes[:, : cfg.n_q], old)
        audio.scatter_(2, write.unsqueeze(-1), new.unsqueeze(-1))
        # 2. The input frame at offset; streams not yet past their delay read their initial token.
        model_input = cache.tokens[rows, :, o % self.slots]  # [B, 1 + n_q]
        is_init = o[:, None] <= self.delays
        model_input = torch.where(is_init, cache.initial.expand_as(model_input), model_input)
        # 3. Temporal step, greedy text, extra heads.
        hidden, logits = self.model.temporal(self.model.embed(model_input), self.state.transformer, exec_mask)
        text = logits.argmax(-1)
        probs = self.model.extra_head_probs(hidden)
        new_o = o + exec_mask.long()
        at = new_o % self.slots
        cache.tokens[rows, 0, at] = torch.where(exec_mask, text, cache.tokens[rows, 0, at])
        cache.offset.copy_(new_o)
        # 4. The de-delayed text.
        out = cache.tokens[rows, 0, (new_o - cfg.max_delay + self.delays[0]) % self.slots]
        valid = exec_mask & (new_o > cfg.max_delay)
        out = torch.where(valid, out, torch.full_like(out, UNGENERATED))
        end_of_turn = probs[:, END_OF_TURN_HEAD, END_OF_TURN_INDEX] if cfg.has_end_of_turn else None
        return TranscriptStep(text=out, valid=valid, extra_heads=probs, end_of_turn=end_of_turn)
