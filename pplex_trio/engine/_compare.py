"""What quantization does to one conversation: ``pplex-trio compare``.

Two engines of one slot run the same conversation (system prompt, voice,
the caller's audio).  The *reference* (full precision) samples as a server
would; the *candidate* (``--quantize`` / ``--kv-cache``) is teacher-forced
on the reference's tokens: before each of its steps its token cache is made
the reference's, with the tokens the reference chose marked as given, so
its text logits and each depformer step's logits are predictions of the
same next token from the same history, while its KV ring holds its own
(quantized) computation of that history.  Per step: whether the two top-1
tokens agree (text, and each agent codebook), and the KL divergence
``KL(reference || candidate)`` of the text and audio distributions at
temperature 1.  The caller's audio is encoded once, by the reference's
Mimi, for both.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .._conversation import FRAME_SECONDS
from ..model import StepInputs
from ._interface import Conversation
from ._personaplex import PersonaPlexEngine

STEPS_PER_MINUTE = round(60 / FRAME_SECONDS)  # 750


@dataclasses.dataclass
class Comparison:
    """Per-step figures of one compared conversation (arrays of ``steps`` rows)."""

    text_agree: np.ndarray  # [steps] bool
    audio_agree: np.ndarray  # [steps, codebooks] bool
    text_kl: np.ndarray  # [steps]
    audio_kl: np.ndarray  # [steps, codebooks]
    reference_ms: np.ndarray  # [steps] wall time of the reference's step (device synchronised)
    candidate_ms: np.ndarray
    prompt_steps: int

    def summary(self) -> dict[str, Any]:
        """The whole run, its first and last minute (its halves when shorter than two), per codebook."""
        steps = len(self.text_kl)
        span = min(STEPS_PER_MINUTE, steps // 2) or steps
        parts = {"all": slice(0, steps), "first": slice(0, span), "last": slice(steps - span, steps)}
        out: dict[str, Any] = {"steps": steps, "prompt_steps": self.prompt_steps, "window_steps": span}
        for name, part in parts.items():
            out[name] = {
                "text_top1": float(self.text_agree[part].mean()) if steps else float("nan"),
                "audio_top1": float(self.audio_agree[part].mean()) if steps else float("nan"),
                "text_kl": float(self.text_kl[part].mean()) if steps else float("nan"),
                "audio_kl": float(self.audio_kl[part].mean()) if steps else float("nan"),
            }
        out["audio_top1_per_codebook"] = self.audio_agree.mean(axis=0).tolist() if steps else []
        out["audio_kl_per_codebook"] = self.audio_kl.mean(axis=0).tolist() if steps else []
        out["reference_ms_per_step"] = float(np.median(self.reference_ms)) if steps else float("nan")
        out["candidate_ms_per_step"] = float(np.median(self.candidate_ms)) if steps else float("nan")
        return out

    def per_step(self) -> list[dict[str, Any]]:
        """One record per step: whether the top tokens agreed, and the KL divergences (text, per codebook)."""
        return [
            {
                "text_top1": bool(self.text_agree[i]),
                "audio_top1": self.audio_agree[i].tolist(),
                "text_kl": float(self.text_kl[i]),
                "audio_kl": self.audio_kl[i].tolist(),
            }
            for i in range(len(self.text_kl))
        ]


def compare(
    reference: PersonaPlexEngine, candidate: PersonaPlexEngine, conversation: Conversation, pcm: np.ndarray
) -> Comparison:
    """Run ``conversation`` with ``pcm`` (float32 mono at the model's rate, whole frames) on both engines
    (slot 0 of each, one slot each), the candidate teacher-forced on the reference's tokens."""
    prompt_steps = reference.start(0, conversation)
    candidate.start(0, conversation)
    reference.prefill({0: prompt_steps})
    candidate.prefill({0: prompt_steps})
    ref, cand = reference._tick, candidate._tick
    rules, slots = ref.gen.rules, ref.gen.rules.slots
    frame = reference.frame_size
    live = torch.ones(1, dtype=torch.bool, device=ref.device)
    rows: dict[str, list[Any]] = {name: [] for name in ("ta", "aa", "tk", "ak", "rms", "cms")}
    with torch.no_grad(), ref.on_device():
        for start in range(0, len(pcm) - frame + 1, frame):
            ref.pcm.copy_(torch.from_numpy(pcm[None, start : start + frame]))
            codes = ref.model.mimi.encode_frame(ref.pcm, ref.encoder, live)
            inputs = StepInputs(tokens=torch.cat([ref.free_tokens, codes], dim=1), exec_mask=live)
            provided, offset = ref.gen.cache.provided.clone(), ref.gen.cache.offset.clone()
            began = time.perf_counter()
            r = ref.gen.step(inputs, ref.sampling, ref.noise.draw(live), return_logits=True)
            ref.synchronize()
            middle = time.perf_counter()
            # The candidate: the reference's history, and what the reference chose given, not sampled.
            provided[:, rules.generated, offset % slots] = True
            cand.gen.cache.tokens.copy_(ref.gen.cache.tokens.to(cand.device))
            cand.gen.cache.provided.copy_(provided.to(cand.device))
            cand.gen.cache.offset.copy_(offset.to(cand.device))
            with cand.on_device():
                c = cand.gen.step(_moved(inputs, cand.device), return_logits=True)
                cand.synchronize()
            ended = time.perf_counter()
            assert r.text_logits is not None and r.audio_logits is not None
            assert c.text_logits is not None and c.audio_logits is not None
            rows["ta"].append((r.text_logits.argmax(-1) == c.text_logits.to(ref.device).argmax(-1))[0].item())
            rows["aa"].append((r.audio_logits.argmax(-1) == c.audio_logits.to(ref.device).argmax(-1))[0].tolist())
            rows["tk"].append(_kl(r.text_logits, c.text_logits.to(ref.device))[0].item())
            rows["ak"].append(_kl(r.audio_logits, c.audio_logits.to(ref.device))[0].tolist())
            rows["rms"].append(1000 * (middle - began))
            rows["cms"].append(1000 * (ended - middle))
    codebooks = ref.gen.depformer_steps
    return Comparison(
        text_agree=np.array(rows["ta"], dtype=bool),
        audio_agree=np.array(rows["aa"], dtype=bool).reshape(-1, codebooks),
        text_kl=np.array(rows["tk"], dtype=np.float64),
        audio_kl=np.array(rows["ak"]).reshape(-1, codebooks),
        reference_ms=np.array(rows["rms"]),
        candidate_ms=np.array(rows["cms"]),
        prompt_steps=prompt_steps,
    )


def _kl(reference: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(reference) || softmax(candidate))`` over the last axis, in float32."""
    p = F.log_softmax(reference.float(), dim=-1)
    q = F.log_softmax(candidate.float(), dim=-1)
    return (p.exp() * (p - q)).sum(-1)


def _moved(inputs: StepInputs, device: torch.device) -> StepInputs:
    return StepInputs(tokens=inputs.tokens.to(device), exec_mask=inputs.exec_mask.to(device))
