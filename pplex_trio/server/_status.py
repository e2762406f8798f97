"""The status page's figures: what the server holds now, and its last minutes, one point a second.

:class:`StatusSampler` is a task of the server (started by ``serve``) that
wakes once a second and reads the tick histograms' cumulative buckets
(``pplex_tick_lateness_seconds``, ``pplex_tick_engine_seconds``): the
difference from the second before is that second's ticks, and their
quantiles are estimated from the buckets as Prometheus' ``histogram_quantile``
does (linear within a bucket).  The tick itself does nothing for the page:
it observes those histograms for ``/metrics`` already, and the sampler only
reads them, off the tick, a few microseconds a second.

:func:`status_report` is ``GET /api/status``: the slots by state, the queue,
each conversation (its protocol, state, persona, voice, age and quality
figures when its description has them), the history, and the GPU's memory
when the engine runs on one (the engine is asked: an echo server has no torch).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import trio
from prometheus_client import Histogram

from ._context import ServerContext
from .sessions import Session

HISTORY_SECONDS = 300  # what the page plots: the last five minutes
PERSONA_CHARS = 80  # a persona is shown this long at most


@dataclasses.dataclass(frozen=True)
class Second:
    """One second of the server's history; a quantile is None in a second with no tick."""

    t: float  # when it ended, on the server's clock (trio.current_time)
    ticks: int
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None
    engine_p50_ms: float | None
    engine_p99_ms: float | None
    live: int  # conversations live at its end


def bucket_counts(histogram: Histogram) -> tuple[list[float], list[float]]:
    """An unlabelled histogram's upper bounds and cumulative counts, as ``/metrics`` shows them."""
    bounds: list[float] = []
    counts: list[float] = []
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bounds.append(float(sample.labels["le"]))
                counts.append(sample.value)
    return bounds, counts


def quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The ``q`` quantile of cumulative bucket counts, interpolated within its bucket (Prometheus'
    ``histogram_quantile``: the first bucket starts at 0; one in ``+Inf`` is the highest finite bound).
    None when the buckets hold nothing."""
    total = cumulative[-1] if cumulative else 0
    if total <= 0:
        return None
    rank = q * total
    below, lower = 0.0, 0.0
    for bound, count in zip(bounds, cumulative):
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below) if count > below else lower
        below, lower = count, bound
    return lower


class _Deltas:
    """A histogram's buckets since the last :meth:`take`."""

    def __init__(self, histogram: Histogram):
        self._histogram = histogram
        self._bounds, self._last = bucket_counts(histogram)

    def take(self) -> tuple[list[float], list[float]]:
        bounds, counts = bucket_counts(self._histogram)
        delta = [now - before for now, before in zip(counts, self._last)]
        self._last = counts
        return bounds, delta


class StatusSampler:
    """The server's last :data:`HISTORY_SECONDS`, one :class:`Second` a second (see the module's docstring)."""

    def __init__(self, server: ServerContext):
        self.server = server
        self.history: collections.deque[Second] = collections.deque(maxlen=HISTORY_SECONDS)
        self._lateness = _Deltas(server.metrics.tick_lateness)
        self._engine = _Deltas(server.metrics.tick_engine)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample once a second until cancelled (on the server's clock: a late wake-up does not drift)."""
        task_status.started()
        due = trio.current_time()
        while True:
            due += 1.0
            await trio.sleep_until(due)
            self.sample()

    def sample(self) -> Second:
        """Close the second that just ended: its ticks from the histograms' deltas."""
        bounds, lateness = self._lateness.take()
        engine_bounds, engine = self._engine.take()
        ms = lambda q, b, c: None if (v := quantile(q, b, c)) is None else round(1000 * v, 3)  # noqa: E731
        second = Second(
            t=trio.current_time(),
            ticks=round(lateness[-1]) if lateness else 0,
            lateness_p50_ms=ms(0.5, bounds, lateness),
            lateness_p99_ms=ms(0.99, bounds, lateness),
            engine_p50_ms=ms(0.5, engine_bounds, engine),
            engine_p99_ms=ms(0.99, engine_bounds, engine),
            live=self.server.actor.statistics().slots["live"],
        )
        self.history.append(second)
        return second


def status_report(server: ServerContext, sampler: StatusSampler) -> dict[str, Any]:
    """``GET /api/status``: now, the history (as columns, ``t`` in seconds before now), the GPU's memory."""
    now = trio.current_time()
    stats = server.actor.statistics()
    history = list(sampler.history)
    columns = [field.name for field in dataclasses.fields(Second) if field.name != "t"]
    return {
        "model": server.engine.name,
        "slots_total": stats.slots_total,
        "slots": stats.slots,
        "queued": stats.queued,
        "queue_size": server.settings.queue_size,
        "ticks": stats.ticks,
        "ticks_skipped": stats.ticks_skipped,
        "sessions": [_conversation(session, now) for session in sorted(server.sessions, key=lambda s: s.id)],
        "history": {
            "period_s": 1.0,
            "t": [round(s.t - now, 3) for s in history],
            **{name: [getattr(s, name) for s in history] for name in columns},
        },
        "gpu_memory": server.engine.device_memory(),
    }


def _conversation(session: Session, now: float) -> dict[str, Any]:
    """One row of the page's table: a session's description, cut down to what the page shows."""
    described = session.describe()
    conversation = session.lease.conversation if session.lease is not None else None
    started = session.started_at
    row = {
        "id": described["id"],
        "protocol": described["protocol"],
        "state": described["state"],
        "persona": conversation.persona[:PERSONA_CHARS] if conversation is not None else None,
        "voice": conversation.voice if conversation is not None else None,
        "age_s": round(now - started, 1) if started is not None else 0.0,
    }
    if described.get("quality") is not None:  # (a conversation's quality figures, where the server keeps them)
        row["quality"] = described["quality"]
    if described.get("words") is not None:
        row["words"] = described["words"]
    return row
