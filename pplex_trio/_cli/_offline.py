"""``pplex-trio offline``: run one conversation from a WAV file, like the reference's offline tool.

The system prompt (voice, silence, persona, silence) runs first; then the
input is streamed frame by frame (80 ms, the last frame zero-padded) as the
user's audio.  Written: the agent's audio (same duration as the input,
24 kHz mono WAV) and a JSON list with one string per frame: ``EPAD`` /
``PAD`` for the padding ids, otherwise the SentencePiece piece with ``▁``
as a space (exactly the reference's ``output_text.json``).  A frame the
model has no output for yet (the first one of a model without system
prompt, such as Kyutai's Moshi) is silent, and its text is ``""``.

With ``--transcribe`` the caller's words are written too (``--output-heard``,
by default beside ``--output-text``): the transcriber's piece per frame in the
same convention, its end-of-turn probability per frame, and the words with
the seconds into the input where each began and ended
(:class:`~pplex_trio.model.WordAssembler`, the model's delay taken off).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import sphn

from .._precision import KVFormat, Precision, WeightFormat
from .._sources import DEFAULT_REPO

if TYPE_CHECKING:
    from ..engine import EngineTranscriber

logger = logging.getLogger(__name__)

DEFAULT_PERSONA = "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``offline`` subcommand's arguments."""
    parser.add_argument(
        "--model",
        default=DEFAULT_REPO,
        help=f"'tiny', a Hugging Face repo id or a local folder (default {DEFAULT_REPO})",
    )
    parser.add_argument("--input-wav", required=True, help="the user's audio (any rate, first channel used)")
    parser.add_argument("--output-wav", required=True, help="where to write the agent's audio (24 kHz WAV)")
    parser.add_argument("--output-text", required=True, help="where to write the per-frame text (JSON list)")
    parser.add_argument("--text-prompt", default=DEFAULT_PERSONA, help="the persona (system prompt)")
    parser.add_argument(
        "--voice-prompt",
        default=None,
        help="a voice of the model's library (NATF2.pt; default: the first), or a file: a .pt voice "
        "prompt or a recording (.wav, .flac, .mp3, .ogg), found from here or in the model's folder",
    )
    parser.add_argument("--voice-prompt-dir", default=None, help="use this folder as the voice library")
    parser.add_argument("--greedy", action="store_true", help="argmax everywhere instead of sampling")
    parser.add_argument("--seed", type=int, default=-1, help="sampling seed (-1: random)")
    parser.add_argument("--temp-text", type=float, default=0.7)
    parser.add_argument("--topk-text", type=int, default=25)
    parser.add_argument("--temp-audio", type=float, default=0.8)
    parser.add_argument("--topk-audio", type=int, default=250)
    parser.add_argument("--device", default=None, help="cuda, cpu, cuda:1 ... (default: cuda if available)")
    parser.add_argument(
        "--transcribe",
        default="off",
        help="also write the caller's words: tiny, a Kyutai speech-to-text repo id or folder, auto (as serve), or "
        "off (the default)",
    )
    parser.add_argument(
        "--output-heard", default=None, help="where to write the caller's words (default: beside --output-text)"
    )
    add_precision_arguments(parser)


def add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """``--quantize`` and ``--kv-cache``, as serve has them (``precision_of`` reads them back)."""
    parser.add_argument(
        "--quantize",
        choices=[str(f) for f in WeightFormat],
        default=str(WeightFormat.NONE),
        help="int8: the LM's projection weights in 8 bits (default none)",
    )
    parser.add_argument(
        "--kv-cache",
        choices=[str(f) for f in KVFormat],
        default=str(KVFormat.MODEL),
        help="fp8: the KV cache in 8 bits (default model: the LM's dtype)",
    )


def precision_of(args: argparse.Namespace) -> Precision:
    """The :class:`Precision` asked for by ``--quantize`` and ``--kv-cache``."""
    return Precision(WeightFormat(args.quantize), KVFormat(args.kv_cache))


def run(args: argparse.Namespace) -> int:
    """Run the command; returns the process exit code."""
    from ..engine import Conversation, PersonaPlexEngine, Sampling, SlotMode
    from ..model import ModelAccessError, VoiceNotFoundError
    from ._engines import resolve_device, resolve_transcriber

    try:
        voice_dir, voice = voice_location(args.model, args.voice_prompt, args.voice_prompt_dir)
        device = resolve_device(args.device or "auto")
        transcribe, required = resolve_transcriber(args.transcribe, args.model, device)
        engine = PersonaPlexEngine.load(
            args.model,
            1,
            device=device,
            voice_dir=voice_dir,
            precision=precision_of(args),
            transcribe=transcribe,
            transcribe_required=required,
        )
        seed = None if args.seed < 0 else args.seed
        sampling = Sampling(
            text_temperature=args.temp_text,
            text_topk=args.topk_text,
            audio_temperature=args.temp_audio,
            audio_topk=args.topk_audio,
            text_seed=seed,
            audio_seed=seed,
            greedy=args.greedy,
        )
        steps = engine.start(0, Conversation(persona=args.text_prompt, voice=voice, sampling=sampling))
    except (ModelAccessError, VoiceNotFoundError, ValueError) as exc:
        logger.error("%s", exc)
        return 1
    try:
        audio, padded = read_frames(args.input_wav, engine.sample_rate, engine.frame_size)
    except ValueError as exc:
        logger.error("%s", exc)
        return 1
    frame = engine.frame_size
    frames = len(padded) // frame

    began = time.perf_counter()
    engine.prefill({0: steps})
    logger.info("system prompt: %d steps in %.2f s", steps, time.perf_counter() - began)
    tokenizer = engine.model.tokenizer
    out_frames, texts = [], []
    heard = HeardWriter(engine.transcriber) if engine.transcriber is not None else None
    start = time.perf_counter()
    for i in range(frames):
        out = engine.step([SlotMode.LIVE], padded[None, i * frame : (i + 1) * frame])
        out_frames.append(out.pcm[0])
        token = int(engine.last_tokens[0, 0])
        piece = tokenizer.offline_piece(token) if token >= 0 else ""
        texts.append(piece)
        logger.debug("frame %d text %r", i, piece)
        if heard is not None:
            heard.push(i, engine.last_heard[0], None if out.end_of_turn is None else out.end_of_turn[0])
    elapsed = time.perf_counter() - start
    logger.info("%d frames in %.1f s (%.1f ms per frame)", frames, elapsed, 1000 * elapsed / max(frames, 1))
    output = np.concatenate(out_frames)[: audio.shape[0]] if out_frames else np.zeros(0, dtype=np.float32)
    sphn.write_wav(args.output_wav, output, engine.sample_rate)
    with open(args.output_text, "w", encoding="utf-8") as f:
        json.dump(texts, f, ensure_ascii=False)
    logger.info("wrote %s and %s", args.output_wav, args.output_text)
    if heard is not None:
        path = args.output_heard or str(Path(args.output_text).with_suffix("")) + ".heard.json"
        with open(path, "w", encoding="utf-8") as f:
            json.dump(heard.result(), f, ensure_ascii=False, indent=1)
        logger.info("wrote the caller's words to %s", path)
    return 0


class HeardWriter:
    """The caller's words of one offline run: each frame's piece and end-of-turn probability, and the words."""

    def __init__(self, transcriber: EngineTranscriber):
        from ..model import WordAssembler

        cfg, tokenizer = transcriber.config, transcriber.loaded.tokenizer
        self.name, self.delay_s, self.tokenizer = transcriber.name, cfg.audio_delay_seconds, tokenizer
        self.words = WordAssembler(
            tokenizer.sp,
            text_card=cfg.text_card,
            delay_s=cfg.audio_delay_seconds,
            frame_rate=cfg.frame_rate,
            pad_ids=(cfg.end_of_text_padding_id, cfg.existing_text_padding_id),
            end_of_padding_id=cfg.end_of_text_padding_id,
        )
        self.pieces: list[str] = []
        self.end_of_turn: list[float | None] = []
        self.done: list[dict[str, float | str]] = []

    def push(self, step: int, token: int, end_of_turn: float | None) -> None:
        """Frame ``step``'s token (negative: none) and end-of-turn probability."""
        self.pieces.append(self.tokenizer.offline_piece(token) if token >= 0 else "")
        self.end_of_turn.append(end_of_turn)
        if token >= 0:
            self.done += [dataclasses.asdict(word) for word in self.words.push(step, token)]

    def result(self) -> dict[str, object]:
        """The JSON object written: the model, its delay, the pieces, the probabilities, the words."""
        words = self.done + [dataclasses.asdict(word) for word in self.words.flush()]
        return {
            "model": self.name,
            "delay_s": self.delay_s,
            "tokens": self.pieces,
            "end_of_turn": self.end_of_turn,
            "words": words,
        }


def read_frames(path: str, sample_rate: int, frame: int) -> tuple[np.ndarray, np.ndarray]:
    """A wav's first channel at ``sample_rate`` as float32, and the same zero-padded to whole frames.

    Error handling: ``ValueError`` naming the file when it cannot be read.
    """
    try:
        pcm, rate = sphn.read(path)
    except Exception as exc:  # sphn raises plain exceptions for unreadable files
        raise ValueError(f"cannot read {path}: {exc}") from None
    if rate != sample_rate:
        pcm = sphn.resample(pcm, src_sample_rate=rate, dst_sample_rate=sample_rate)
    audio = np.asarray(pcm[0], dtype=np.float32)
    padded = np.zeros(-(-audio.shape[0] // frame) * frame, dtype=np.float32)
    padded[: audio.shape[0]] = audio
    return audio, padded


def voice_location(model: str, voice: str | None, voice_dir: str | None) -> tuple[str | None, str | None]:
    """(voice folder, voice name) for ``--voice-prompt``: a bare name is looked up in the library; a path
    (as the reference's tool takes) makes its folder the library, found from here or in a local model's folder.

    Error handling: ``ValueError`` for a path that is in neither place.
    """
    if voice is None or (os.sep not in voice and "/" not in voice):
        return voice_dir, voice
    for path in (Path(voice), Path(model) / voice):
        if path.is_file():
            return str(path.parent), path.name
    raise ValueError(f"voice prompt {voice} not found (looked here and in {model})")
