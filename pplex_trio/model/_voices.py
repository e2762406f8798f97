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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .._cache import extract_once
from .._voice_catalogue import AUDIO_SUFFIXES, VoiceNotFoundError, check_voice_name, voice_files, voice_path
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
    """The voices of one folder, loaded on demand and cached: ``*.pt`` voice prompts, and recordings that
    ``make`` (given by the model that owns the library) turns into voice prompts."""

    def __init__(self, folder: Path | None, make: Callable[[Path], VoicePrompt] | None = None):
        self.folder = Path(folder) if folder is not None else None
        self._make = make
        self._cache: dict[str, VoicePrompt] = {}
        self._unusable: dict[str, str] = {}  # recordings that could not be made into a voice: why

    def names(self) -> list[str]:
        """The library's usable voices (none without a folder: a model may come without voices)."""
        if self.folder is None or not self.folder.is_dir():
            return []
        return [name for name in voice_files(self.folder) if name not in self._unusable]

    def get(self, name: str) -> VoicePrompt:
        """Load a voice (once), making a recording into a voice prompt on first use.

        Error handling: :class:`VoiceNotFoundError` for a bad or unknown name,
        or a recording that cannot be made into a voice (its reason said).
        """
        check_voice_name(name)
        if name in self._unusable:
            raise VoiceNotFoundError(f"voice {name!r} cannot be used: {self._unusable[name]}")
        if name not in self._cache:
            if self.folder is None:
                raise VoiceNotFoundError(f"unknown voice {name!r}; available: none (this model has no voices)")
            path = voice_path(self.folder, name)
            if not name.lower().endswith(AUDIO_SUFFIXES):
                self._cache[name] = VoicePrompt.from_file(path)
            elif self._make is None:
                raise VoiceNotFoundError(f"voice {name!r} is a recording, and this library cannot make voices")
            else:
                try:
                    self._cache[name] = self._make(path)
                except ValueError as exc:
                    self._unusable[name] = str(exc)
                    raise VoiceNotFoundError(f"voice {name!r} cannot be used: {exc}") from None
        return self._cache[name]

    def make_recordings(self) -> None:
        """Make every recording of the folder into a voice prompt now (an engine does this when it is built,
        so that no conversation's start pays for it); one that cannot be is logged and left out."""
        for name in self.names():
            if name.lower().endswith(AUDIO_SUFFIXES) and self._make is not None:
                try:
                    self.get(name)
                except VoiceNotFoundError as exc:
                    logger.warning("%s", exc)


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


TARGET_LOUDNESS = -24.0  # LUFS, as the reference's voice generation
VOICE_RATES = (8_000, 48_000)  # the sample rates a recording may come at


def read_voice_recording(path: Path, sample_rate: int) -> np.ndarray:
    """A recording as mono float32 at ``sample_rate`` (any format sphn reads, stereo downmixed).

    Error handling: ``ValueError`` for a file sphn cannot read, a sample rate
    outside :data:`VOICE_RATES` or no audio.
    """
    import sphn

    try:
        pcm, rate = sphn.read(str(path))
    except Exception as exc:  # sphn raises plain exceptions for unreadable files
        raise ValueError(f"{path.name} is not a recording this server can read ({exc})") from None
    if not VOICE_RATES[0] <= rate <= VOICE_RATES[1]:
        raise ValueError(f"{path.name} is sampled at {rate} Hz: give a recording at 8 to 48 kHz")
    if pcm.ndim != 2 or pcm.shape[1] == 0:
        raise ValueError(f"{path.name} holds no audio")
    mono = pcm.mean(axis=0, keepdims=True, dtype=np.float32) if pcm.shape[0] > 1 else pcm[:1]
    if rate != sample_rate:
        mono = sphn.resample(mono, src_sample_rate=rate, dst_sample_rate=sample_rate)
    return np.asarray(mono[0], dtype=np.float32)


def normalize_loudness(pcm: np.ndarray, sample_rate: int, target: float = TARGET_LOUDNESS) -> np.ndarray:
    """``pcm`` brought to ``target`` LUFS (ITU-R BS.1770 through pyloudnorm, as the reference does).

    Error handling: ``ValueError`` for a recording with no measurable
    loudness (silent, or shorter than the meter's 0.4 s block): the gain
    would be infinite, and NaN would reach the model.
    """
    import pyloudnorm

    loudness = pyloudnorm.Meter(sample_rate).integrated_loudness(pcm) if pcm.size >= 0.4 * sample_rate else -np.inf
    if not np.isfinite(loudness):
        raise ValueError(f"the recording is silent or shorter than 0.4 s ({pcm.size / sample_rate:.2f} s): it has no "
                         "loudness to bring to -24 LUFS; record a few seconds of the voice")
    return pyloudnorm.normalize.loudness(pcm, loudness, target)


def voice_from_recording(lm: LMModel, mimi: Mimi, path: Path, sine_tokens: tuple[int, ...],
                         zero_text_code: int = 3) -> tuple[VoicePrompt, np.ndarray]:
    """The reference's voice generation from a recording file: read, downmix, resample to Mimi's rate,
    normalise to -24 LUFS, then :func:`make_voice_prompt`.  Returns the prompt and its Mimi codes."""
    pcm = normalize_loudness(read_voice_recording(path, mimi.cfg.sample_rate), mimi.cfg.sample_rate)
    return make_voice_prompt(lm, mimi, pcm.astype(np.float32), sine_tokens, zero_text_code, name=path.name)
