"""What a session tells of its call: the quality meter and the caller's words fed every frame, the recorder
(``--record``), the figures at the end of the call.

The lease calls :meth:`CallReport.on_frame` with every frame it delivers (on the actor's task, before the lossy
outbox, a few µs): the meter and the recorder see the conversation's whole timeline, whatever the client read.
"""

from __future__ import annotations

from typing import Any

from ..._conversation import Outcome
from ..._metrics import Metrics
from ...codec import WORD_START, ConversationQuality, Response, TurnResponse
from ...engine import Lease, OutputFrame
from ..records import CallEnding, Recorder
from ._transcript import TURN_BY_MODEL, CallerTranscript, TurnEnded

AGENT_CHARS = 200  # the agent's latest words kept for /api/sessions (the tail of a long reply)


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


class CallReport:
    """One conversation's timeline as its lease delivers it: the quality meter, the caller's words
    (:class:`~._transcript.CallerTranscript`, which the adapters read), and the recorder if any."""

    def __init__(self, metrics: Metrics, transcript: CallerTranscript | None = None):
        self.metrics = metrics
        self.quality = ConversationQuality()
        self.transcript = transcript or CallerTranscript(None)
        self.recorder: Recorder | None = None  # set once the conversation's settings are known (--record)
        self.agent = AgentWords()

    def on_frame(self, frame: OutputFrame) -> None:
        """The lease's observer (the actor's task, every frame, a few µs): the quality meter, both sides' words,
        and the recorder."""
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
        self, outcome: Outcome, close_code: int | None, lease: Lease | None, details: dict[str, Any], sample_rate: int
    ) -> CallEnding:
        """What the call record says of how the call went (``details``: the protocol's and the sender's), with the
        caller's words and turns when the engine transcribes (``caller``: its last words end the last turn)."""
        quality = self.quality.statistics().as_dict()
        if self.transcript.enabled:
            self.transcript.finish(tick=-1)
            details = {**details, "caller": self.transcript.as_dict()}
        if lease is None:  # (the queue was full: nothing was recorded)
            assert self.recorder is not None
            return CallEnding(
                outcome=outcome,
                close_code=close_code,
                conversation=self.recorder.conversation,
                details={**details, "quality": quality},
            )
        inputs = lease.input_stats()
        ms = 1000 / sample_rate  # per sample
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
