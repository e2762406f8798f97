"""The one interface the EngineActor drives.

An engine owns a batch of ``num_slots`` conversation rows and advances all of
them together, one 80 ms frame per call to :meth:`Engine.step`.  It is *not*
thread-safe: the actor calls its methods one at a time, from a worker thread,
never two at once.  Everything here is synchronous on purpose.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import pathlib
import typing
from collections.abc import Mapping, Sequence

import numpy as np

from .._conversation import FRAME_SIZE, SAMPLE_RATE, Conversation, Sampling

__all__ = [
    "FRAME_SIZE",
    "SAMPLE_RATE",
    "Conversation",
    "ConversationRejected",
    "Engine",
    "Sampling",
    "SlotMode",
    "StepOutput",
    "Job",
]


class ConversationRejected(ValueError):
    """Raised by :meth:`Engine.start` when a conversation's request cannot be served.

    Its message goes to the client as is (close code 1008), so it should say
    what to change, e.g. "voice 'X.pt' is not a valid voice prompt file".
    Any other exception from ``start`` counts as an internal error (1011).
    """


class SlotMode(enum.IntEnum):
    """What a row does during one :meth:`Engine.step`."""

    IDLE = 0  # free, draining or running its system prompt (:meth:`Engine.prefill`): input and output ignored
    LIVE = 1  # consumes one input frame, produces one output frame


@dataclasses.dataclass
class StepOutput:
    """One frame per row: ``pcm`` is float32 ``[num_slots, FRAME_SIZE]``.

    ``text[i]`` is the text piece row ``i`` produced this step (with its
    leading space, if any), or ``None``.  Rows that were not LIVE carry
    silence and ``None``.

    An engine with a transcriber also gives what it heard: ``heard_text[i]``,
    the piece of the caller's words row ``i``'s transcriber wrote this step
    (None: padding), and ``end_of_turn[i]``, its probability that the
    caller's turn has ended (None: no such head); both None without a
    transcriber.  ``transcriber_failed``: its step raised, this step's words
    are lost (the conversations go on).
    """

    pcm: np.ndarray
    text: list[str | None]
    heard_text: list[str | None] | None = None
    end_of_turn: list[float | None] | None = None
    transcriber_failed: bool = False


class Job(typing.Protocol):
    """Work the actor runs between ticks on the engine's thread, a few frames per engine call, like system
    prompts (a voice being made from a recording: :meth:`Engine.make_voice`)."""

    @property
    def frames_left(self) -> int:
        """Frames still to run (0: :meth:`result` may be read)."""

    def advance(self, frames: int) -> None:
        """Do the next ``frames`` frames of it (at most those left)."""

    def result(self) -> bytes:
        """What it made, once no frame is left (a voice: a voice prompt file the engine loads by name from
        its voice store)."""


class Engine(abc.ABC):
    """A batched streaming speech model (or a stand-in for tests)."""

    num_slots: int
    frame_size: int = FRAME_SIZE
    sample_rate: int = SAMPLE_RATE

    @property
    def tick_path(self) -> str:
        """How the engine runs its steps (``/health`` shows it): ``eager``, ``cuda_graph``, ``compiled``,
        ``compiled_cuda_graph``, or, when one was wanted, ``eager_after_failed_capture`` /
        ``eager_after_failed_check`` (its replay or the compiled tick differed from the eager tick)."""
        return "eager"

    @property
    def transcript_delay(self) -> float | None:
        """Seconds the caller's words (``StepOutput.heard_text``) run behind their audio: a piece of step
        ``n`` of a conversation is about ``n * 0.08 - transcript_delay`` s into it; None without a transcriber."""
        return None

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Human-readable model name for ``/api/info``."""

    @abc.abstractmethod
    def voices(self) -> Sequence[str]:
        """Voice names a conversation may ask for (bare file names)."""

    @abc.abstractmethod
    def start(self, slot: int, conversation: Conversation) -> int:
        """Reset row ``slot`` and prepare its system prompt.

        Returns how many prompt positions :meth:`prefill` must run before the
        row can go LIVE (0 is allowed).  Other rows are not touched: they stay
        bit-identical to a run in which this call never happened.
        """

    @abc.abstractmethod
    def prefill(self, work: Mapping[int, int]) -> dict[int, int]:
        """Run up to ``work[slot]`` positions of each started slot's system prompt, between steps.

        Returns how many positions each slot ran (never more than it had
        left).  The rows of other slots are not touched.  The time it takes
        grows with the positions: the actor sizes ``work`` to the time free
        before the next step.
        """

    @abc.abstractmethod
    def step(self, modes: Sequence[SlotMode], pcm: np.ndarray) -> StepOutput:
        """Advance every row by one frame.

        ``modes`` has one entry per slot; ``pcm`` is float32
        ``[num_slots, frame_size]`` (rows that are not LIVE hold silence).
        """

    @abc.abstractmethod
    def reset(self, slot: int) -> None:
        """Forget row ``slot``'s conversation (called when its slot is freed)."""

    def make_voice(self, pcm: np.ndarray) -> Job:
        """A job that makes a voice from ``pcm`` (mono float32 at :attr:`sample_rate`, at -24 LUFS); cheap
        to create (no device work until its first :meth:`Job.advance`).

        Error handling: ``NotImplementedError`` for an engine that has no voices to make.
        """
        raise NotImplementedError(f"{self.name} cannot make voices")

    def use_voice_store(self, folder: pathlib.Path) -> None:  # noqa: B027 (a no-op by default, not abstract)
        """Voices added while the server runs are kept in ``folder`` (``NAME.pt``, written by the server):
        a conversation may name them like the engine's own.  Called once, before the first conversation."""

    def device_memory(self) -> dict[str, int] | None:
        """The GPU's memory in bytes, for the status page: ``allocated`` and ``reserved`` by this process's
        allocator, ``free`` and ``total`` on the device; None when the engine runs on no GPU.

        The one method called from the event loop while a step may run: it reads counters and does no
        device work, so it never waits for the step."""
        return None

    def reset_all(self) -> None:
        """Bring the engine back to a clean state after a failed step."""
        for slot in range(self.num_slots):
            self.reset(slot)
