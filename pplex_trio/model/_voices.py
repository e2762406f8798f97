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
import io
import logging
import typing
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .._cache import extract_once
from .._voice_catalogue import AUDIO_SUFFIXES, VoiceNotFoundError, check_voice_name, voice_files
from ..codec import voice_audio
from ._lm import LMModel
from ._lockstep import CacheRules, TokenCache
from ._mimi import Mimi, MimiEncoderState

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class VoicePrompt:
    """A stored voice: the input embeddings of its prompt steps and the token cache after them."""

    name: str
    embeddings: torch.Tensor  # [T, dim]
    cache: torch.Tensor  # [1, K, slots] long

    @property
    def num_steps(self) -> int:
        """Prompt steps the voice takes (one per 80 ms frame of its recording)."""
        return self.embeddings.shape[0]

    @classmethod
    def from_file(cls, path: Path) -> VoicePrompt:
        """Load a voice file (the reference's ``.pt`` layout) onto the CPU; ``ValueError`` if it is not one."""
        data = torch.load(path, map_location="cpu", weights_only=True)
        try:
            emb, cache = data["embeddings"], data["cache"]
        except (KeyError, TypeError):
            raise ValueError(f"{path} is not a voice prompt (a dict with 'embeddings' and 'cache')") from None
        return cls(name=path.name, embeddings=emb.reshape(emb.shape[0], emb.shape[-1]), cache=cache.long())

    def save(self, path: Path | typing.BinaryIO) -> None:
        """Write the voice in the reference's ``.pt`` layout, readable by :meth:`from_file`."""
        emb = self.embeddings.reshape(self.num_steps, 1, 1, -1).cpu()
        torch.save({"embeddings": emb, "cache": self.cache.cpu()}, path)


class VoiceLibrary:
    """The voices of one folder, loaded on demand and cached: ``*.pt`` voice prompts, and recordings that
    ``make`` (given by the model that owns the library) turns into voice prompts.

    ``added`` is a second folder, of voices added while a server runs (its
    ``--voice-store``): they are found by name like the folder's own, but are
    not among :meth:`names` (the server lists them as added).  A voice whose
    file changed since it was loaded (deleted and added again) is loaded again.
    """

    def __init__(
        self, folder: Path | None, make: Callable[[Path], VoicePrompt] | None = None, added: Path | None = None
    ):
        self.folder = Path(folder) if folder is not None else None
        self.added = added
        self._make = make
        self._cache: dict[str, tuple[tuple[int, int, int], VoicePrompt]] = {}  # name: (file identity, prompt)
        self._unusable: dict[str, str] = {}  # recordings that could not be made into a voice: why

    def names(self) -> list[str]:
        """The library's own usable voices (none without a folder: a model may come without voices)."""
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
        path = self._path(name)
        info = path.stat()
        identity = (info.st_ino, info.st_mtime_ns, info.st_size)
        cached = self._cache.get(name)
        if cached is not None and cached[0] == identity:
            return cached[1]
        if not name.lower().endswith(AUDIO_SUFFIXES):
            prompt = VoicePrompt.from_file(path)
        elif self._make is None:
            raise VoiceNotFoundError(f"voice {name!r} is a recording, and this library cannot make voices")
        else:
            try:
                prompt = self._make(path)
            except ValueError as exc:
                self._unusable[name] = str(exc)
                raise VoiceNotFoundError(f"voice {name!r} cannot be used: {exc}") from None
        self._cache[name] = (identity, prompt)
        return prompt

    def _path(self, name: str) -> Path:
        for folder in (self.folder, self.added):
            if folder is not None and (folder / name).is_file():
                return folder / name
        if self.folder is None and self.added is None:
            raise VoiceNotFoundError(f"unknown voice {name!r}; available: none (this model has no voices)")
        raise VoiceNotFoundError(f"unknown voice {name!r}; available: {', '.join(self.names()) or 'none'}")

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


class VoiceMaking:
    """A voice prompt being made from a recording, a few frames per :meth:`advance` (an engine runs it
    between its ticks), as the reference's voice generation does.

    ``pcm`` is mono float audio at Mimi's rate, already at -24 LUFS
    (:func:`~pplex_trio.codec._voice_audio.voice_audio`).  Each 1920-sample
    frame (the last zero-padded) is encoded by a fresh Mimi stream and forced
    on the agent's audio streams, with PAD text and the sine on the user's;
    the reference's first call only initialises its cache, so the first
    frame's codes never reach the LM.  Every stream being forced, what the
    reference saves (each step's input embedding and the token cache after)
    does not depend on the transformer, which therefore does not run: a
    frame costs a Mimi encoding and an embedding lookup.
    """

    def __init__(
        self,
        lm: LMModel,
        mimi: Mimi,
        pcm: np.ndarray,
        sine_tokens: tuple[int, ...],
        zero_text_code: int = 3,
        name: str = "custom.pt",
    ):
        frame = mimi.frame_size
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        frames = max(1, -(-pcm.shape[0] // frame))
        self._pcm = np.zeros(frames * frame, dtype=np.float32)
        self._pcm[: pcm.shape[0]] = pcm
        self._lm, self._mimi, self.name = lm, mimi, name
        self._fixed = (zero_text_code, tuple(sine_tokens))
        self.frames_total = frames
        self._done = 0
        self._codes: list[torch.Tensor] = []  # on the device, read back once at the end
        self._embeddings: list[torch.Tensor] = []
        self._stream: _Stream | None = None  # from the first advance

    @property
    def frames_left(self) -> int:
        """Frames still to encode before the prompt is done."""
        return self.frames_total - self._done

    @torch.no_grad()
    def advance(self, frames: int) -> None:
        """Make the next ``frames`` frames (at most those left)."""
        lm, mimi = self._lm, self._mimi
        if self._stream is None:
            self._stream = _Stream.of(lm, mimi, self._pcm, *self._fixed)
        st = self._stream
        size = mimi.frame_size
        for i in range(self._done, min(self.frames_total, self._done + frames)):
            codes = mimi.encode_frame(st.pcm[None, i * size : (i + 1) * size], st.encoder)
            self._codes.append(codes)
            if i > 0:
                tokens = torch.cat([st.zero_text, codes[0], st.sine])[None]
                step = st.rules.begin(st.cache, tokens, st.ones)
                self._embeddings.append(lm.embed(step.model_input)[0])
                st.rules.end(st.cache, step, st.ones, step.target)  # nothing to choose: every stream is forced
            self._done = i + 1

    def prompt(self) -> VoicePrompt:
        """The voice prompt (once every frame is made)."""
        assert self.frames_left == 0 and self._stream is not None, "the voice is not made yet"
        dim = self._lm.cfg.dim
        embeddings = torch.stack(self._embeddings).cpu() if self._embeddings else torch.zeros(0, dim)
        return VoicePrompt(name=self.name, embeddings=embeddings, cache=self._stream.cache.tokens.clone().cpu())

    @property
    def codes(self) -> np.ndarray:
        """The Mimi codes of the frames made so far, ``[frames, 8]``."""
        return torch.cat(self._codes).cpu().numpy() if self._codes else np.zeros((0, 8), dtype=np.int64)

    def result(self) -> bytes:
        """The voice prompt as a ``.pt`` file in the reference's format."""
        buffer = io.BytesIO()
        self.prompt().save(buffer)
        return buffer.getvalue()


@dataclasses.dataclass
class _Stream:
    """A voice's Mimi stream and token cache, with its audio and the fixed tokens on the device (copied once,
    so that a frame waits for no transfer)."""

    encoder: MimiEncoderState
    rules: CacheRules
    cache: TokenCache
    pcm: torch.Tensor  # [frames * frame_size]
    zero_text: torch.Tensor  # [1]
    sine: torch.Tensor  # the user's streams
    ones: torch.Tensor  # [1] bool: the one row executes

    @classmethod
    def of(cls, lm: LMModel, mimi: Mimi, pcm: np.ndarray, zero_text: int, sine: tuple[int, ...]) -> _Stream:
        device = lm.device
        rules = CacheRules.of(lm.cfg, min(lm.cfg.dep_q, lm.cfg.num_agent_codebooks), device)
        return cls(
            encoder=mimi.init_encoder_state(1),
            rules=rules,
            cache=rules.fresh_cache(1),
            pcm=torch.from_numpy(pcm).to(device),
            zero_text=torch.tensor([zero_text], device=device),
            sine=torch.tensor(sine, device=device),
            ones=torch.ones(1, dtype=torch.bool, device=device),
        )


def make_voice_prompt(
    lm: LMModel,
    mimi: Mimi,
    pcm: np.ndarray,
    sine_tokens: tuple[int, ...],
    zero_text_code: int = 3,
    name: str = "custom.pt",
) -> tuple[VoicePrompt, np.ndarray]:
    """Make a voice prompt from a recording at once (:class:`VoiceMaking`); returns it and its Mimi codes
    ``[frames, 8]``."""
    making = VoiceMaking(lm, mimi, pcm, sine_tokens, zero_text_code, name)
    making.advance(making.frames_total)
    return making.prompt(), making.codes


def voice_from_recording(
    lm: LMModel, mimi: Mimi, path: Path, sine_tokens: tuple[int, ...], zero_text_code: int = 3
) -> tuple[VoicePrompt, np.ndarray]:
    """The reference's voice generation from a recording file (read, downmix, resample to Mimi's rate,
    -24 LUFS, then :func:`make_voice_prompt`).  Error handling: ``ValueError`` (why it cannot be a voice)."""
    pcm = voice_audio(path, mimi.cfg.sample_rate)
    return make_voice_prompt(lm, mimi, pcm, sine_tokens, zero_text_code, name=path.name)
