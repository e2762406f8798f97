"""What ``/api/sessions`` shows of a session's lease: its slot, its place in the queue, its input and output
counters (in milliseconds of audio)."""

from __future__ import annotations

from typing import Any

from ...engine import Lease, LeaseState


def lease_figures(lease: Lease | None, sample_rate: int) -> dict[str, Any]:
    """``lease``'s figures now (None: the session has no lease yet, or never had one)."""
    ms = 1000 / sample_rate  # per sample
    inputs = lease.input_stats() if lease else None
    return {
        "slot": lease.slot if lease else None,
        "queue_position": lease.position if lease and lease.state is LeaseState.QUEUED else None,
        "frames_consumed": lease.frames_consumed if lease else 0,
        "input_backlog_ms": round(inputs.pending * ms, 1) if inputs else 0.0,
        "input_margin_ms": round(inputs.margin * ms, 1) if inputs else 0.0,
        "input_underruns": inputs.underruns if inputs else 0,
        "input_skipped_ms": round(inputs.skipped * ms, 1) if inputs else 0.0,
        "input_behind_ms": round(inputs.behind * ms, 1) if inputs else 0.0,
        "input_caught_up_ms": round(inputs.caught_up * ms, 1) if inputs else 0.0,
        "output_caught_up_frames": lease.output_skipped if lease else 0,
    }
