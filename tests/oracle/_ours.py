"""Drive our implementation (``pplex_trio.model``) with the same calls as :mod:`_moshi_ref`.

Loading always goes through the normal loader (``load_model(folder)``), the
one the server uses.  Inputs and outputs are numpy arrays shaped like the
moshi side's, so a test compares the two with one ``assert_array_equal``.
"""

from __future__ import annotations

import pathlib
import typing as tp

import _moshi_ref as ref
import numpy as np
import torch

from pplex_trio.model import FREE, LMGen, LoadedModel, StepInputs, load_model


def load(directory: pathlib.Path) -> LoadedModel:
    return load_model(str(directory), device="cpu")


def semantics(model: LoadedModel) -> ref.Semantics:
    """Which reference our implementation follows for ``model``, in moshi's terms.

    ``ModelConfig.reference`` (``pplex_trio.model``'s docstring): Kyutai's
    checkpoints run moshi 0.2.13's own rules (:data:`_moshi_ref.KYUTAI`,
    nothing patched); PersonaPlex checkpoints run NVIDIA's fork for the
    attention window of the LM and Mimi rings and for the user-audio timing
    (:data:`_moshi_ref.FORK`).  The depformer follows Kyutai's rule in both
    (every step sees all earlier ones, as trained).
    """
    return {"kyutai": ref.KYUTAI, "personaplex": ref.FORK}[model.config.reference]


def _mask(rows: tp.Iterable[int], batch: int) -> torch.Tensor:
    mask = torch.zeros(batch, dtype=torch.bool)
    mask[list(rows)] = True
    return mask


def _exec(exec_masks: tp.Mapping[int, tp.Sequence[bool]], t: int, batch: int) -> torch.Tensor:
    return torch.tensor(exec_masks[t], dtype=torch.bool) if t in exec_masks else torch.ones(batch, dtype=torch.bool)


@torch.no_grad()
def _mimi_stream(
    init_state: tp.Callable[[int], tp.Any],
    step: tp.Callable[[torch.Tensor, tp.Any, torch.Tensor], torch.Tensor],
    inputs: np.ndarray,
    dtype: type,
    resets: tp.Mapping[int, tp.Sequence[int]] | None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None,
) -> np.ndarray:
    """Run ``step(frame, state, exec_mask)`` frame by frame over ``inputs`` ``[B, T, ...]``.

    ``resets[t]`` lists rows whose state restarts just before frame ``t``;
    ``exec_masks[t]`` is frame ``t``'s exec mask (all rows run otherwise).
    """
    resets, exec_masks = resets or {}, exec_masks or {}
    batch, steps, _ = inputs.shape
    state = init_state(batch)
    out = []
    for t in range(steps):
        if t in resets:
            state.reset(_mask(resets[t], batch))
        frame = torch.from_numpy(np.ascontiguousarray(inputs[:, t], dtype=dtype))
        out.append(step(frame, state, _exec(exec_masks, t, batch)).numpy())
    return np.stack(out, axis=1)


def mimi_encode(
    model: LoadedModel,
    pcm: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None = None,
) -> np.ndarray:
    """Streaming encode ``[B, T, 1920]`` -> ``[B, T, 8]`` with per-frame resets / exec masks."""
    return _mimi_stream(model.mimi.init_encoder_state, model.mimi.encode_frame, pcm, np.float32, resets, exec_masks)


def mimi_decode(
    model: LoadedModel,
    codes: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None = None,
) -> np.ndarray:
    """Streaming decode ``[B, T, 8]`` -> ``[B, T, 1920]``."""
    return _mimi_stream(model.mimi.init_decoder_state, model.mimi.decode_frame, codes, np.int64, resets, exec_masks)


@torch.no_grad()
def lm_generate(
    model: LoadedModel,
    user_codes: np.ndarray,
    resets: tp.Mapping[int, tp.Sequence[int]] | None = None,
    exec_masks: tp.Mapping[int, tp.Sequence[bool]] | None = None,
    depformer_steps: int | None = None,
    hidden: list[np.ndarray] | None = None,
) -> np.ndarray:
    """Greedy run: user codes ``[B, T, 8]`` -> ``[B, T, 9]`` (text + agent audio, -2 = none yet).

    The user codes are forced on streams 9-16, everything else is the
    model's choice.  If ``hidden`` is a list, each step's temporal output
    ``[B, dim]`` is appended to it (for bit-identity checks).
    """
    resets, exec_masks = resets or {}, exec_masks or {}
    batch, steps, _ = user_codes.shape
    cfg = model.config.lm
    gen = LMGen(model.lm, batch, depformer_steps=depformer_steps)
    out = []
    for t in range(steps):
        if t in resets:
            gen.reset(_mask(resets[t], batch))
        tokens = torch.full((batch, cfg.num_streams), FREE, dtype=torch.long)
        tokens[:, 1 + cfg.num_agent_codebooks :] = torch.from_numpy(np.ascontiguousarray(user_codes[:, t]))
        result = gen.step(StepInputs(tokens=tokens, exec_mask=_exec(exec_masks, t, batch)))
        out.append(result.tokens[:, : 1 + cfg.num_agent_codebooks].numpy())
        if hidden is not None:
            hidden.append(result.hidden.numpy().copy())
    return np.stack(out, axis=1)
