"""Voice prompts: the ``voices/*.pt`` library, and making a voice prompt from audio.

A voice prompt is what the reference saves after feeding a recording of
the desired voice through the LM: ``embeddings`` ``[T, 1, 1, dim]`` (the
LM's summed input embedding at each step) and ``cache`` ``[1, 17, 4]`` (the
token cache afterwards).  Replaying the embeddings and restoring the cache
puts the LM where the recording left it, without Mimi.

Which names exist and how a name maps to a file are the voice catalogue's
rules (:mod:`pplex_trio._voice_catalogue`): a bare ``NAME.pt``, resolved
only inside the library folder.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch

from .._cache import extract_once
from .._voice_catalogue import VoiceNotFoundError, check_voice_name, voice_files, voice_path
from ._lm import LMModel
from ._lockstep import LMGen, StepInputs
from ._mimi import Mimi

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class VoicePrompt:
    name: str
    embeddings: torch.Tensor  # [T, dim]
    cache: torch.Tensor  # [1, K, slots] long

    @property
    def num_steps(self) -> int:
        return self.embeddings.shape[0]

    @classmethod
    def from_file(cls, path: Path) -> "VoicePrompt":
        data = torch.load(path, map_location="cpu", weights_only=True)
        try:
            emb, cache = data["embeddings"], data["cache"]
        except (KeyError, TypeError):
            raise ValueError(f"{path} is not a voice prompt (a dict with 'embeddings' and 'cache')") from None
        return cls(name=path.name, embeddings=emb.reshape(emb.shape[0], emb.shape[-1]), cache=cache.long())

    def save(self, path: Path) -> None:
        emb = self.embeddings.reshape(self.num_steps, 1, 1, -1).cpu()
        torch.save({"embeddings": emb, "cache": self.cache.cpu()}, path)


class VoiceLibrary:
    """The ``*.pt`` voice prompts of one folder, loaded on demand and cached."""

    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder is not None else None
        self._cache: dict[str, VoicePrompt] = {}

    def names(self) -> list[str]:
        """The library's voices (none without a folder: a model may come without voices)."""
        if self.folder is None or not self.folder.is_dir():
            return []
        return voice_files(self.folder)

    def get(self, name: str) -> VoicePrompt:
        """Load a voice (once).  Error handling: :class:`VoiceNotFoundError` for a bad or unknown name."""
        check_voice_name(name)
        if name not in self._cache:
            if self.folder is None:
                raise VoiceNotFoundError(f"unknown voice {name!r}; available: none (this model has no voices)")
            self._cache[name] = VoicePrompt.from_file(voice_path(self.folder, name))
        return self._cache[name]


def extract_voices(archive: Path, cache_root: Path) -> Path:
    """Extract ``voices.tgz`` once into the cache; returns the ``voices`` folder."""
    folder = extract_once(archive, cache_root, "voices") / "voices"
    if not folder.is_dir():
        raise RuntimeError(f"{archive} has no voices/ folder")
    return folder


@torch.no_grad()
def make_voice_prompt(lm: LMModel, mimi: Mimi, pcm: np.ndarray, sine_tokens: tuple[int, ...],
                      zero_text_code: int = 3, name: str = "custom.pt") -> tuple[VoicePrompt, np.ndarray]:
    """Make a voice prompt from a recording, as the reference's voice generation does.

    ``pcm`` is mono float audio at Mimi's sample rate (the reference first
    normalises it to -24 LUFS; do that beforehand if you need the same
    result).  Each 1920-sample frame (the last one zero-padded) is encoded
    by a fresh Mimi stream and forced on the agent's audio streams, with
    PAD text and the sine on the user's.  The reference's first call only
    initialises its cache, so the first frame's tokens never reach the LM.
    Returns the prompt and the Mimi codes ``[frames, 8]``.
    """
    frame = mimi.frame_size
    pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
    frames = -(-pcm.shape[0] // frame)
    pcm = np.concatenate([pcm, np.zeros(frames * frame - pcm.shape[0], dtype=np.float32)])
    device = lm.device
    state = mimi.init_encoder_state(1)
    codes = [mimi.encode_frame(torch.from_numpy(pcm[i * frame:(i + 1) * frame]).to(device)[None], state)
             for i in range(frames)]
    gen = LMGen(lm, 1)
    ones = torch.ones(1, dtype=torch.bool, device=device)
    sine = torch.tensor(sine_tokens, device=device)
    embeddings = []
    for c in codes[1:]:
        tokens = torch.cat([torch.tensor([zero_text_code], device=device), c[0], sine])[None]
        result = gen.step(StepInputs(tokens=tokens, exec_mask=ones), run_depformer=False, return_embeddings=True)
        embeddings.append(result.embeddings[0])
    prompt = VoicePrompt(name=name, embeddings=torch.stack(embeddings).cpu(), cache=gen.cache.tokens.clone().cpu())
    return prompt, torch.cat(codes).cpu().numpy()
