"""Conversation quality on the model's timeline: response latency, talk-over, dead air, the agent's share, barge-ins.

Feed :class:`ConversationQuality` every frame pair of a conversation, in tick
order: what the model heard (the caller) and what it said (the agent), one
80 ms frame each.  It is pure and cheap (about 3 µs a frame, see
``docs/BENCHMARKS.md``), so the lease's observer calls it on the tick path.

**Speech, per channel.**  A frame is *loud* when its RMS reaches
:data:`~pplex_trio.codec._vad.SPEECH_THRESHOLD_DB` (the VAD's threshold, over
the whole frame: the VAD's own 20 ms windows cost 17 µs a frame and channel,
too much for the tick path).  Speech starts with :data:`MIN_SPEECH_FRAMES`
loud frames in a row (a shorter blip is silence) and ends with
:data:`HANGOVER_FRAMES` silent frames in a row (a shorter pause is part of the
speech); either is dated at the first frame of its run.  A frame is decided
once its run is, so the figures lag the conversation by at most
``HANGOVER_FRAMES`` frames; at the end, what is still undecided is silence.

**The figures** (frame *k* is at ``k × 80 ms``):

- *response latency*: from the caller's end of speech (its first silent
  frame) to the agent's next start of speech, when the agent was silent as
  the caller ended and starts before the caller speaks again, within
  :data:`MAX_RESPONSE_FRAMES` (10 s); one per response;
- *talk-over*: frames where both speak, in seconds;
- *dead air*: frames where both are silent after the caller's end of speech,
  until either speaks again; summed over the gaps (it includes each
  response's latency; beyond it, a caller left waiting);
- *agent share*: the agent's speech frames over all frames;
- *barge-ins*: the caller starts speaking while the agent speaks, and the
  agent stops within :data:`BARGE_IN_FRAMES` frames (480 ms).

**From the model's end of turn** (``--transcribe`` with an end-of-turn head):
:meth:`ConversationQuality.turn_ended` is told each turn the transcriber ended
(its first word's start, its end, seconds on the same timeline), which comes
the transcriber's delay after the fact, so the figures are taken from the
decided frames kept for :data:`TURN_HISTORY_FRAMES` (as the turn comes) and
from those decided after it:

- *response latency (turn)*: from the turn's end to the agent's next start of
  speech, when the agent was silent at the turn's end and starts before the
  caller speaks again, within :data:`MAX_RESPONSE_FRAMES`;
- *talk-over (turn)*: the frames the agent speaks within the caller's turns
  (from its first word to its end), in seconds.

**Outages.**  A conversation paused for a resume (its connection dropped) is
not stepped, so no frame of the outage is fed: the figures are the model's,
and the outage is never dead air.  :meth:`ConversationQuality.gap` marks where
the frames stopped: a response (or a barge-in) that would be measured across
that mark is not measured at all, since neither the model's frames nor the
caller's clock tell how long the caller really waited for it.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics as _statistics
from typing import Any

import numpy as np

from .._conversation import FRAME_SECONDS, FRAME_SIZE
from ._vad import SPEECH_THRESHOLD_DB

MIN_SPEECH_FRAMES = 2  # 160 ms loud in a row start speech (one loud frame is a click)
HANGOVER_FRAMES = 6  # 480 ms silent in a row end it (the VAD's silence_duration_ms)
BARGE_IN_FRAMES = 6  # the agent stops within 480 ms of the caller starting over it: a barge-in
MAX_RESPONSE_FRAMES = 125  # 10 s: an agent that starts later is not answering that turn
TURN_HISTORY_FRAMES = 250  # 20 s of decided frames kept for the turns, which come the transcriber's delay late
_LOUD_ENERGY = FRAME_SIZE * (10 ** (SPEECH_THRESHOLD_DB / 20)) ** 2  # sum of squares over a frame at the threshold


@dataclasses.dataclass(frozen=True)
class Response:
    """The agent started speaking ``seconds`` after the caller's end of speech."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class BargeIn:
    """The caller spoke over the agent, and the agent stopped."""


@dataclasses.dataclass(frozen=True)
class TurnResponse:
    """The agent started speaking ``seconds`` after the model's end of the caller's turn."""

    seconds: float


QualityEvent = Response | BargeIn | TurnResponse


@dataclasses.dataclass(frozen=True)
class QualityStatistics:
    """A conversation's figures so far (frames decided up to now)."""

    frames: int
    response_latencies: tuple[float, ...]  # seconds, one per response, in order
    talk_over_s: float
    dead_air_s: float
    agent_share: float  # 0..1 (0 before any frame)
    barge_ins: int
    turns: int = 0  # the model's ends of turn told (0: the figures below are not taken)
    turn_response_latencies: tuple[float, ...] = ()
    turn_talk_over_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The ``quality`` object of ``/api/sessions`` and of the call record."""
        figures = {
            "response_latency_ms": _latencies_ms(self.response_latencies),
            "talk_over_s": round(self.talk_over_s, 2),
            "dead_air_s": round(self.dead_air_s, 2),
            "agent_share": round(self.agent_share, 3),
            "barge_ins": self.barge_ins,
        }
        if self.turns:  # (the model's ends of turn: only with a transcriber that has the head)
            figures["response_latency_turn_ms"] = _latencies_ms(self.turn_response_latencies)
            figures["talk_over_turn_s"] = round(self.turn_talk_over_s, 2)
        return figures

    def summary(self) -> str:
        """One line's worth, for the end-of-call log."""
        latencies = self.response_latencies
        response = (
            f"response {round(_statistics.median(latencies) * 1000)} ms median of {len(latencies)}"
            if latencies
            else "no response"
        )
        return (
            f"{response}, talk-over {self.talk_over_s:.1f} s, dead air {self.dead_air_s:.1f} s, "
            f"agent {self.agent_share:.0%}, barge-ins {self.barge_ins}"
        )


def _latencies_ms(latencies: tuple[float, ...]) -> dict[str, Any]:
    return {
        "last": round(latencies[-1] * 1000) if latencies else None,
        "median": round(_statistics.median(latencies) * 1000) if latencies else None,
        "count": len(latencies),
    }


class _Speech:
    """One channel's speech decision: loud frames in, decided frames out (in order, a few frames late)."""

    def __init__(self) -> None:
        self.speaking = False
        self.decided: collections.deque[bool] = collections.deque()
        self._run = 0  # undecided frames: the latest ones, on the other side of `speaking`

    def feed(self, loud: bool) -> None:
        if loud == self.speaking:  # a run that did not last is what the state was
            self.decided.extend([loud] * (self._run + 1))
            self._run = 0
            return
        self._run += 1
        if self._run >= (MIN_SPEECH_FRAMES if loud else HANGOVER_FRAMES):
            self.speaking = loud
            self.decided.extend([loud] * self._run)
            self._run = 0

    def finish(self) -> None:
        """The end: a blip too short to be speech, or a pause in speech, is silence."""
        self.decided.extend([False] * self._run)
        self._run = 0


class ConversationQuality:
    """The quality meter of one conversation (see the module's docstring for the definitions).

    ``feed`` and ``finish`` return the events they complete (usually none), for
    metrics that count as they happen; :meth:`statistics` reads the figures.
    """

    def __init__(self) -> None:
        self._caller_speech, self._agent_speech = _Speech(), _Speech()
        self._frames = 0  # decided frames
        self._caller = self._agent = False  # at the last decided frame
        self._agent_frames = self._both = self._dead = 0
        self._latencies: list[float] = []
        self._barge_ins = 0
        self._awaiting: int | None = None  # the caller's end of speech, while the agent's answer is awaited
        self._after_caller = False  # in a silence that followed the caller's speech
        self._interrupted: int | None = None  # the caller started over the agent here
        # The model's turns: the decided frames, the latest ones, as (caller, agent); what a turn awaits.
        self._history: collections.deque[tuple[bool, bool]] = collections.deque(maxlen=TURN_HISTORY_FRAMES)
        self._turns = 0
        self._turn_latencies: list[float] = []
        self._turn_both = 0  # frames the agent spoke within the caller's turns
        self._turn_talk: tuple[int, int] | None = None  # a turn's frames [from, to) not yet decided
        self._turn_awaiting: int | None = None  # a turn's end, while the agent's answer is awaited
        self._fed = 0  # frames fed (decided or not)
        self._gaps: list[int] = []  # the first frame fed after each outage

    def feed(self, heard: np.ndarray | None, said: np.ndarray) -> tuple[QualityEvent, ...]:
        """One tick: the caller's frame (None: silence) and the agent's."""
        self._fed += 1
        self._caller_speech.feed(heard is not None and float(np.dot(heard, heard)) >= _LOUD_ENERGY)
        self._agent_speech.feed(float(np.dot(said, said)) >= _LOUD_ENERGY)
        return self._decide()

    def gap(self) -> None:
        """The conversation was paused (an outage) after the frames fed so far: nothing is measured across it."""
        self._gaps.append(self._fed)

    @property
    def caller_speaking(self) -> bool:
        """Whether the caller speaks, as decided so far (a start ``MIN_SPEECH_FRAMES``, an end
        ``HANGOVER_FRAMES`` frames after the fact): the energy VAD's end of a turn."""
        return self._caller_speech.speaking

    def finish(self) -> tuple[QualityEvent, ...]:
        """The conversation is over: decide the last frames."""
        self._caller_speech.finish()
        self._agent_speech.finish()
        return self._decide()

    def statistics(self) -> QualityStatistics:
        """The figures so far, as a frozen record (call :meth:`finish` first for the final ones)."""
        frames = self._frames
        return QualityStatistics(
            frames=frames,
            response_latencies=tuple(self._latencies),
            talk_over_s=self._both * FRAME_SECONDS,
            dead_air_s=self._dead * FRAME_SECONDS,
            agent_share=self._agent_frames / frames if frames else 0.0,
            barge_ins=self._barge_ins,
            turns=self._turns,
            turn_response_latencies=tuple(self._turn_latencies),
            turn_talk_over_s=self._turn_both * FRAME_SECONDS,
        )

    def turn_ended(self, start: float, end: float) -> tuple[QualityEvent, ...]:
        """The model ended a caller's turn that began at ``start`` and ended at ``end`` (seconds on this
        timeline): its talk-over, and the agent's answer if it is there already."""
        self._turns += 1
        first_frame, end_frame = round(start / FRAME_SECONDS), round(end / FRAME_SECONDS)
        oldest = self._frames - len(self._history)  # the frame of history[0]
        self._turn_talk = None
        for k in range(max(first_frame, oldest), min(end_frame, self._frames)):
            self._turn_both += self._history[k - oldest][1]
        if end_frame > self._frames:
            self._turn_talk = (max(first_frame, self._frames), end_frame)
        self._turn_awaiting = end_frame if end_frame > oldest else None  # (older than the history: let go)
        events: tuple[QualityEvent, ...] = ()
        for k in range(max(end_frame, oldest + 1), self._frames):  # (the answer may be decided already)
            event = self._turn_frame(k, self._history[k - 1 - oldest], self._history[k - oldest])
            events += (event,) if event is not None else ()
        return events

    def _turn_frame(self, k: int, previous: tuple[bool, bool], now: tuple[bool, bool]) -> TurnResponse | None:
        """Decided frame ``k`` (``previous``: the one before) for a turn's figures."""
        talk = self._turn_talk
        if talk is not None and talk[0] <= k < talk[1]:
            self._turn_both += now[1]
        awaiting = self._turn_awaiting
        if awaiting is None or k < awaiting:
            return None
        if k == awaiting and previous[1] or now[0] and not previous[0] or k - awaiting > MAX_RESPONSE_FRAMES:
            self._turn_awaiting = None  # the agent talks on, the caller speaks again, or the agent never answered
        elif now[1] and not previous[1]:
            self._turn_awaiting = None
            if self._across_gap(awaiting, k):
                return None
            latency = (k - awaiting) * FRAME_SECONDS
            self._turn_latencies.append(latency)
            return TurnResponse(latency)
        return None

    def _across_gap(self, since: int, k: int) -> bool:
        """Whether an outage lies between frames ``since`` and ``k``."""
        return any(since < first <= k for first in self._gaps)

    def _decide(self) -> tuple[QualityEvent, ...]:
        caller, agent = self._caller_speech.decided, self._agent_speech.decided
        events: tuple[QualityEvent, ...] = ()
        while caller and agent:
            events += self._frame(caller.popleft(), agent.popleft())
        return events

    def _frame(self, c: bool, a: bool) -> tuple[QualityEvent, ...]:
        """One decided frame: the caller speaks (``c``), the agent speaks (``a``)."""
        k = self._frames
        event: QualityEvent | None = None
        if c != self._caller:
            if c:  # the caller starts: no answer is awaited any more
                self._awaiting, self._after_caller = None, False
                if a:
                    self._interrupted = k
            else:  # the caller's end of speech
                self._after_caller = True
                self._awaiting = None if self._agent else k
        if a != self._agent:
            if a:
                awaiting = self._awaiting
                if awaiting is not None and k - awaiting <= MAX_RESPONSE_FRAMES and not self._across_gap(awaiting, k):
                    latency = (k - awaiting) * FRAME_SECONDS
                    self._latencies.append(latency)
                    event = Response(latency)
                self._awaiting = None
            elif (
                self._interrupted is not None
                and k - self._interrupted <= BARGE_IN_FRAMES
                and not self._across_gap(self._interrupted, k)
            ):
                self._barge_ins += 1
                self._interrupted = None
                event = BargeIn()
        if self._interrupted is not None and k - self._interrupted >= BARGE_IN_FRAMES:
            self._interrupted = None  # the agent talked on
        self._caller, self._agent = c, a
        self._frames += 1
        self._agent_frames += a
        self._both += c and a
        if self._after_caller:
            if c or a:
                self._after_caller = False
            else:
                self._dead += 1
        turn = self._turn_frame(k, (self._history[-1] if self._history else (False, False)), (c, a))
        self._history.append((c, a))
        return tuple(e for e in (event, turn) if e is not None)
