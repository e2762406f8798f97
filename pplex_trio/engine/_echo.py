"""EchoEngine: a stand-in engine for tests and server benchmarks.

**This is not the model.**  It returns each slot's input audio delayed by a
fixed number of frames and a text piece per frame (the frame number), so
tests can check exactly what went through the server.  It can sleep during a
step to stand in for GPU compute time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from .._voice_catalogue import OFFICIAL_VOICES, voice_files
from ._interface import FRAME_SIZE, Conversation, Engine, Job, SlotMode, StepOutput

__all__ = ["OFFICIAL_VOICES", "EchoEngine", "Transcript", "scripted_transcript", "voices_in_directory"]

Transcript = Callable[[int, np.ndarray], tuple[str | None, float | None]]
"""A stand-in transcriber for :class:`EchoEngine`: given a LIVE row's frame number (from 0 at its start) and
the frame it heard, the text piece it "heard" (None: none) and the end-of-turn probability (None: no head)."""


def scripted_transcript(pieces: Mapping[int, str], turn_ends: Collection[int] = ()) -> Transcript:
    """A :data:`Transcript` that hears ``pieces[n]`` at a row's frame ``n`` whatever the audio, with an
    end-of-turn probability of 0.9 at the frames of ``turn_ends`` and 0.01 elsewhere."""

    def transcript(frame: int, pcm: np.ndarray) -> tuple[str | None, float | None]:
        return pieces.get(frame), 0.9 if frame in turn_ends else 0.01

    return transcript


# Echo offers the official client's voices unless given a voice folder; a folder is listed
# by the catalogue's one rule, so echo and the real model agree on what a folder holds.
voices_in_directory = voice_files


class EchoEngine(Engine):
    """Echo each LIVE row's input back ``delay_frames`` frames later.

    - ``prefill_steps``: system-prompt positions a conversation runs (:meth:`prefill`) before it is LIVE;
      ``prefill_seconds`` stands in for their compute time, per position.
    - ``step_seconds``: time each step sleeps, standing in for GPU compute.
    - Text: every LIVE step emits ``" <n>"`` where ``n`` counts the row's
      LIVE frames from 0, so ordering and loss are visible at the client.
    - Faults, for tests of the server: ``fail_at_step`` raises in that step
      (counted from 0 over all steps), ``hang_at_step`` sleeps ``hang_seconds``
      in it, as a GPU call that never returns would.
    - ``transcript`` (for tests, not on the command line): what a transcriber
      would have heard (:data:`Transcript`, e.g. :func:`scripted_transcript`),
      given out as ``heard_text`` / ``end_of_turn``, ``transcript_delay`` seconds
      behind; one that raises costs that step's words, as the real engine's does.
    """

    def __init__(
        self,
        num_slots: int,
        *,
        delay_frames: int = 1,
        prefill_steps: int = 12,
        step_seconds: float = 0.0,
        prefill_seconds: float = 0.0,
        voices: Sequence[str] = OFFICIAL_VOICES,
        fail_at_step: int | None = None,
        hang_at_step: int | None = None,
        hang_seconds: float = 30.0,
        text_share: float = 1.0,
        transcript: Transcript | None = None,
        transcript_delay: float = 0.5,
    ):
        if num_slots < 1:
            raise ValueError("num_slots must be at least 1")
        if delay_frames < 0 or prefill_steps < 0 or step_seconds < 0:
            raise ValueError("delay_frames, prefill_steps and step_seconds must not be negative")
        if not 0.0 <= text_share <= 1.0:
            raise ValueError("text_share must be between 0 and 1")
        self.num_slots = num_slots
        self.text_share = text_share  # the share of frames with a text piece (a speaking model: ~0.3)
        self.delay_frames = delay_frames
        self.prefill_steps = prefill_steps
        self.step_seconds = step_seconds
        self.prefill_seconds = prefill_seconds
        self._prompt_left = [0] * num_slots
        self._voices = list(voices)
        # Ring of the last `delay_frames + 1` input frames per row.
        self._history = np.zeros((num_slots, delay_frames + 1, FRAME_SIZE), dtype=np.float32)
        self._frames = np.zeros(num_slots, dtype=np.int64)
        self.started: list[tuple[int, Conversation]] = []  # for tests: what start() received
        self.fail_at_step = fail_at_step
        self.hang_at_step = hang_at_step
        self.hang_seconds = hang_seconds
        self.steps_taken = 0
        self.transcript = transcript
        self._transcript_delay = transcript_delay

    @property
    def name(self) -> str:
        return f"echo (test engine, {self.delay_frames}-frame delay)"

    @property
    def transcript_delay(self) -> float | None:
        return None if self.transcript is None else self._transcript_delay

    def voices(self) -> Sequence[str]:
        return self._voices

    def make_voice(self, pcm: np.ndarray) -> Job:
        """A stand-in voice: one "frame" per 80 ms of ``pcm``, each costing ``prefill_seconds``; the file
        says how long the clip was (echo never reads it)."""
        return _EchoVoice(-(-len(pcm) // FRAME_SIZE), self.prefill_seconds)

    def start(self, slot: int, conversation: Conversation) -> int:
        self.reset(slot)
        self.started.append((slot, conversation))
        self._prompt_left[slot] = self.prefill_steps
        return self.prefill_steps

    def prefill(self, work: Mapping[int, int]) -> dict[int, int]:
        done = {slot: min(n, self._prompt_left[slot]) for slot, n in work.items()}
        for slot, n in done.items():
            self._prompt_left[slot] -= n
        if self.prefill_seconds:
            time.sleep(self.prefill_seconds * sum(done.values()))
        return done

    def reset(self, slot: int) -> None:
        self._history[slot] = 0.0
        self._frames[slot] = 0
        self._prompt_left[slot] = 0

    def step(self, modes: Sequence[SlotMode], pcm: np.ndarray) -> StepOutput:
        step, self.steps_taken = self.steps_taken, self.steps_taken + 1
        if step == self.fail_at_step:
            raise RuntimeError(f"echo engine: the failure asked for at step {step}")
        if step == self.hang_at_step:
            time.sleep(self.hang_seconds)
        if self.step_seconds:
            time.sleep(self.step_seconds)
        out = np.zeros((self.num_slots, FRAME_SIZE), dtype=np.float32)
        text: list[str | None] = [None] * self.num_slots
        rows = np.flatnonzero([mode == SlotMode.LIVE for mode in modes])
        # All rows at once, as a model's batched step would: a loop of small copies per row would hand the
        # GIL back and forth with the event loop at each one.
        n = self._frames[rows]
        depth = self.delay_frames + 1
        self._history[rows, n % depth] = pcm[rows]
        delayed = self._history[rows, (n - self.delay_frames) % depth]
        out[rows] = np.where((n >= self.delay_frames)[:, None], delayed, 0.0)
        self._frames[rows] = n + 1
        for row, k in zip(rows.tolist(), n.tolist()):
            if int((k + 1) * self.text_share) > int(k * self.text_share):  # evenly spread, exact share
                text[row] = f" {k}"
        if self.transcript is None:
            return StepOutput(pcm=out, text=text)
        heard: list[str | None] = [None] * self.num_slots
        turn: list[float | None] = [None] * self.num_slots
        try:
            for row, k in zip(rows.tolist(), n.tolist()):
                heard[row], turn[row] = self.transcript(k, pcm[row])
        except Exception:  # as the real engine: a transcriber's failure costs this step's words only
            return StepOutput(out, text, [None] * self.num_slots, [None] * self.num_slots, transcriber_failed=True)
        return StepOutput(out, text, heard, turn)


class _EchoVoice:
    def __init__(self, frames: int, seconds_per_frame: float):
        self.frames_total, self.frames_left, self._seconds = frames, frames, seconds_per_frame

    def advance(self, frames: int) -> None:
        frames = min(frames, self.frames_left)
        self.frames_left -= frames
        if self._seconds:
            time.sleep(self._seconds * frames)

    def result(self) -> bytes:
        return f"echo test engine voice: {self.frames_total} frames\n".encode()
