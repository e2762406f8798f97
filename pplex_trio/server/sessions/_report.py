"""What a session tells of its call: the quality meter and the caller's words fed every frame, the recorder
(``--record``), the figures at the end of the call.

The lease calls :meth:`CallReport.on_frame` with every frame it delivers (on the actor's task, before the lossy
outbox, a few µs): the meter and the recorder see the conversation's whole timeline, whatever the client read.

**One report per conversation, across resumes.**  The report belongs to the conversation, not to a connection.
When a connection drops and its call is paused for a resume, its session *parks* the report (:meth:`park`) with
the paused lease in the engine's ``ResumeBook`` (the report is the ``Parked`` it knows) and lets go of it: that
session finishes nothing.  Then exactly one of two things happens.  A connection resumes the call: its session
adopts the report (:meth:`resumed`: the outage becomes a gap in the quality meter and in the record) and finishes
it when the call ends, or parks it again.  Or nobody does within the window (or the server ends the paused call, or
stops): the book tells the report (:meth:`lapsed`), which finishes the call as the drop ended it, its record by
the record store's own task.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ..._conversation import FRAME_SECONDS, Outcome
from ..._metrics import Metrics
from ...codec import WORD_START, ConversationQuality, Response, TurnResponse
from ...engine import Lease, OutputFrame
from ..records import CallEnding, Recorder, RecordStore
from ._transcript import TURN_BY_MODEL, CallerTranscript, TurnEnded

logger = logging.getLogger(__name__)

AGENT_CHARS = 200  # the agent's latest words kept for /api/sessions (the tail of a long reply)
OUTAGE = "connection lost"  # the reason a resumed call's record gives its gap


@dataclasses.dataclass(frozen=True)
class CallEnd:
    """How a call ended, as its end-of-call log line and its record tell it."""

    name: str  # "session 7 (raw)"
    outcome: Outcome
    close_code: int | None  # None: the client left without a close from us
    lease: Lease | None  # None: it never had one (the queue was full)
    details: dict[str, Any]  # the protocol's and the sender's (frames_sent)


class AgentWords:
    """The agent's latest words, for ``/api/sessions``: its text pieces since the caller's last turn ended (the
    reply to it), the last :data:`AGENT_CHARS` characters of them."""

    def __init__(self) -> None:
        self._text = ""

    def add(self, piece: str) -> None:
        """One of the model's text pieces (a leading space or ``▁`` begins a word)."""
        self._text = (self._text + piece.replace(WORD_START, " "))[-AGENT_CHARS:]

    def new_turn(self) -> None:
        """The caller's turn ended: what the agent says next is its reply."""
        self._text = ""

    def latest(self) -> str:
        """The words, spaced as the model wrote them."""
        return " ".join(self._text.split())


@dataclasses.dataclass(frozen=True)
class ParkedCall:
    """What a session parks with its paused conversation's token (the engine's ``Parked``): the call's report,
    which observes its frames and is finished if nobody resumes it, and the protocol its client spoke (``wire``:
    a resume goes on with what that client was told)."""

    report: CallReport
    wire: Any

    def on_frame(self, frame: OutputFrame) -> None:
        """The conversation's frame, to its report."""
        self.report.on_frame(frame)

    def lapsed(self) -> None:
        """Nobody resumed it: its report finishes the call."""
        self.report.lapsed()


class CallReport:
    """One conversation's timeline as its lease delivers it: the quality meter, the caller's words
    (:class:`~._transcript.CallerTranscript`, which the adapters read), and the recorder if any."""

    def __init__(
        self,
        call_id: int,
        metrics: Metrics,
        transcript: CallerTranscript | None = None,
        *,
        records: RecordStore | None = None,
        sample_rate: int = 24000,
    ):
        self.id = call_id  # its first session's id, which the sessions that resume it take
        self.metrics = metrics
        self.quality = ConversationQuality()
        self.transcript = transcript or CallerTranscript(None)
        self.records = records
        self.recorder: Recorder | None = None  # set once the conversation's settings are known (--record)
        self.agent = AgentWords()
        self.sample_rate = sample_rate
        self.frames = 0  # frames observed: the model's timeline (an outage has none)
        self.frames_sent_before = 0  # by the connections before the present one
        self._parked: tuple[float, CallEnd] | None = None  # paused: since when, and how the drop would end it
        self._shifts: list[tuple[float, float]] = []  # each outage: where on the model's timeline, its seconds

    # -- across a resume (the ResumeBook's Parked) ----------------------------

    def park(self, now: float, end: CallEnd) -> None:
        """The call's connection dropped and the call is paused: ``end`` is how it ends if nobody resumes it."""
        self._parked = (now, end)
        self.frames_sent_before = end.details.get("frames_sent", 0)

    def resumed(self, now: float) -> None:
        """A connection resumed the paused call: the outage since :meth:`park` is a gap (the meter measures
        nothing across it; the record has it as silence, marked)."""
        assert self._parked is not None, "only a parked report is resumed"
        since, _ = self._parked
        self._parked = None
        self.quality.gap()
        if self.recorder is not None:
            self._shifts.append((self.frames * FRAME_SECONDS, self.recorder.gap(now - since, OUTAGE)))

    def lapsed(self) -> None:
        """Nobody resumed the paused call (the ResumeBook says so, on the actor's task): it ends as the drop ended
        it; its record is finished by the record store's task."""
        assert self._parked is not None, "only a parked report lapses"
        _, end = self._parked
        self._parked = None
        ending = self.close(end)
        if ending is not None and self.recorder is not None and self.records is not None:
            self.records.finish_later(self.recorder, ending)

    def close(self, end: CallEnd) -> CallEnding | None:
        """The call is over: its end-of-call log line, its last quality figures into the metrics; what its record
        is to say (None: no record)."""
        logger.info("%s ended: %s%s", end.name, end.outcome.value, self.finish_quality())
        if self.recorder is None:
            return None
        return self.call_ending(end.outcome, end.close_code, end.lease, end.details)

    def on_frame(self, frame: OutputFrame) -> None:
        """The lease's observer (the actor's task, every frame, a few µs): the quality meter, both sides' words,
        and the recorder."""
        self.frames += 1
        if self.recorder is not None:
            self.recorder.on_frame(frame)
        self._count(self.quality.feed(frame.heard, frame.pcm))
        for event in self.transcript.on_frame(frame, self.quality.caller_speaking):
            if isinstance(event, TurnEnded):
                self.agent.new_turn()
                if event.by == TURN_BY_MODEL:  # (the quality meter has the VAD's own)
                    self._count(self.quality.turn_ended(event.words[0].start, event.at))
        if frame.text:
            self.agent.add(frame.text)

    def latest_words(self) -> dict[str, str | None]:
        """Each side's latest words for ``/api/sessions``: ``caller`` (None when the engine transcribes nothing)
        and ``agent``."""
        return {"caller": self.transcript.latest() if self.transcript.enabled else None, "agent": self.agent.latest()}

    def _count(self, events: tuple[object, ...]) -> None:
        for event in events:
            if isinstance(event, Response):
                self.metrics.response_latency.observe(event.seconds)
            elif isinstance(event, TurnResponse):
                self.metrics.response_latency_turn.observe(event.seconds)
            else:
                self.metrics.barge_ins.inc()

    def finish_quality(self) -> str:
        """The conversation is over: its last quality figures into the metrics; what the log line adds."""
        self._count(self.quality.finish())
        stats = self.quality.statistics()
        if not stats.frames:
            return ""  # (it never went live)
        self.metrics.talk_over.observe(stats.talk_over_s)
        if stats.turns:
            self.metrics.talk_over_turn.observe(stats.turn_talk_over_s)
        self.metrics.dead_air.observe(stats.dead_air_s)
        self.metrics.agent_share.observe(stats.agent_share)
        return f" ({stats.summary()})"

    def call_ending(
        self, outcome: Outcome, close_code: int | None, lease: Lease | None, details: dict[str, Any]
    ) -> CallEnding:
        """What the call record says of how the call went (``details``: the protocol's and the sender's), with the
        caller's words and turns when the engine transcribes (``caller``: its last words end the last turn)."""
        quality = self.quality.statistics().as_dict()
        if self.transcript.enabled:
            self.transcript.finish(tick=-1)
            details = {**details, "caller": self._on_record_timeline(self.transcript.as_dict())}
        if lease is None:  # (the queue was full: nothing was recorded)
            assert self.recorder is not None
            return CallEnding(
                outcome=outcome,
                close_code=close_code,
                conversation=self.recorder.conversation,
                details={**details, "quality": quality},
            )
        inputs = lease.input_stats()
        ms = 1000 / self.sample_rate  # per sample
        return CallEnding(
            outcome=outcome,
            close_code=close_code,
            conversation=lease.conversation,
            details={
                **details,
                "restarts": lease.restarts,
                "output_dropped": lease.output_dropped,
                "output_skipped": lease.output_skipped,
                "input_underruns": inputs.underruns,
                "input_skipped_ms": round(inputs.skipped * ms, 1),
                "input_caught_up_ms": round(inputs.caught_up * ms, 1),
                "quality": quality,
            },
        )

    def _on_record_timeline(self, caller: dict[str, Any]) -> dict[str, Any]:
        """The caller's words and turns (times on the model's timeline) moved onto the record's, which has each
        outage in it: a time from an outage on is later by its length there."""
        if not self._shifts:
            return caller

        def moved(t: float) -> float:
            return round(t + sum(seconds for at, seconds in self._shifts if t >= at - 1e-9), 3)

        keys = ("start", "end", "ended_at")
        return {
            **caller,
            "words": [{**w, **{k: moved(w[k]) for k in keys if k in w}} for w in caller["words"]],
            "turns": [{**t, **{k: moved(t[k]) for k in keys if k in t}} for t in caller["turns"]],
        }
