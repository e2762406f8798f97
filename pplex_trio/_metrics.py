"""Prometheus metrics of one server instance.

Each server gets its own :class:`prometheus_client.CollectorRegistry`, so
several servers in one process (as in the tests) do not share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Ticks are budgeted at 80 ms: resolve well below and above that.
_TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)
_LATENCY_BUCKETS = tuple(
    x / 1000
    for x in (
        0.5,
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
        12,
        14,
        16,
        18,
        20,
        25,
        30,
        35,
        40,
        45,
        50,
        60,
        70,
        80,
        90,
        100,
        120,
        160,
        200,
        300,
        500,
        1000,
    )
)
_LATENESS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 1.0)
_RESPONSE_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
_CONVERSATION_SECONDS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
_SHARE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


DROP_REASONS = ("inbound", "input_backlog", "output_backlog")
REFUSAL_REASONS = ("unauthorized", "forbidden_origin", "too_many_connections")
RECORD_DELETIONS = ("retention", "quota", "request")
ERROR_KINDS = (
    "bad_request",
    "protocol",
    "session",
    "engine",
    "engine_start",
    "engine_reset",
    "engine_stalled",
    "start_rejected",
    "transport",
)


# pplex_webrtc_packets_total's kinds ("dropped": decoded, then waited past a second for its session to read it)
WEBRTC_PACKET_KINDS = ("received", "recovered", "concealed", "late", "dropped")


class Metrics:
    """Every metric the server exports, under the ``pplex_`` prefix."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tick_duration = Histogram(
            "pplex_tick_duration_seconds",
            "Wall time of one engine tick (engine call included)",
            buckets=_TICK_BUCKETS,
            registry=r,
        )
        self.tick_engine = Histogram(
            "pplex_tick_engine_seconds",
            "Time spent inside the engine call of a tick",
            buckets=_TICK_BUCKETS,
            registry=r,
        )
        self.tick_lateness = Histogram(
            "pplex_tick_lateness_seconds",
            "How late a tick started against its 80 ms schedule",
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.tick_input_wait = Histogram(
            "pplex_tick_input_wait_seconds",
            "How long a tick was held for a page that was due (at most the input grace), when it was",
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.tick_margin = Gauge(
            "pplex_tick_margin_seconds",
            "The safety margin the tick grid keeps after the aligned conversations' audio arrives",
            registry=r,
        )
        self.client_reaction = Gauge(
            "pplex_client_reaction_seconds",
            "Median time from the handshake to a client's first page, beyond its audio (recent clients)",
            registry=r,
        )
        self.tick_early = Histogram(
            "pplex_tick_early_seconds",
            "How long before its deadline a tick started because every streaming conversation's frame was in",
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.prompt_call = Histogram(
            "pplex_prompt_call_seconds",
            "One engine call between ticks that runs system prompts (chunked prefill), starts and resets",
            buckets=_TICK_BUCKETS,
            registry=r,
        )
        self.prompt_positions = Counter(
            "pplex_prompt_positions_total", "System-prompt positions run (voice, silence, persona)", registry=r
        )
        self.time_to_live = Histogram(
            "pplex_time_to_live_seconds",
            "From a slot given to a conversation to its going live (its prompt run)",
            buckets=_TICK_BUCKETS + (2.0, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self.ticks_skipped = Counter(
            "pplex_ticks_skipped_total", "Ticks skipped because the actor fell a whole tick or more behind", registry=r
        )
        self.slots = Gauge(
            "pplex_slots", "Conversation slots by state (free, prefill, live, draining, held)", ["state"], registry=r
        )
        self.engine_stalled = Gauge(
            "pplex_engine_stalled", "1 while an engine step has run past --engine-timeout without returning", registry=r
        )
        self.queued = Gauge("pplex_queued", "Connections waiting for a slot", registry=r)
        self.unready = Gauge(
            "pplex_unready",
            "1 for the reason /ready answers 503 (full, draining, engine_stalled, shutting_down), "
            "0 for the others: all 0 while the replica is ready (set when /metrics is read)",
            ["reason"],
            registry=r,
        )
        self.frames_dropped = Counter(
            "pplex_frames_dropped_total", "Audio frames or messages dropped, by reason", ["reason"], registry=r
        )
        self.frames_in = Counter(
            "pplex_frames_in_total", "Input frames consumed by the engine (silence fill excluded)", registry=r
        )
        self.frames_silence = Counter(
            "pplex_frames_silence_filled_total",
            "Ticks where a live slot had no input frame and got silence",
            registry=r,
        )
        self.silence_skipped = Counter(
            "pplex_silence_skipped_seconds_total",
            "Silence skipped to get back to real time after a burst: the caller's not fed to the model (input), the "
            "model's not sent to a reader that fell behind (output)",
            ["direction"],
            registry=r,
        )
        self.conversations_behind = Gauge(
            "pplex_conversations_behind",
            "Conversations whose input is more than a frame behind real time (a burst not caught up with yet)",
            registry=r,
        )
        self.samples_skipped = Counter(
            "pplex_input_samples_skipped_total",
            "Input samples skipped once by phase alignment (framing catches up with the newest audio)",
            registry=r,
        )
        self.added_latency = Histogram(
            "pplex_added_latency_seconds",
            "Per frame: last input sample reached the server -> output frame written to the socket, "
            "minus the engine's compute time for that tick",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.latency_stage = Histogram(
            "pplex_added_latency_stage_seconds",
            "The added latency split by stage: wait_for_tick (input complete -> tick starts), "
            "tick (tick starts -> output handed over, minus compute), encode (the send task wakes + Opus), "
            "send (the write through Quart and hypercorn)",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.frames_out = Counter("pplex_frames_out_total", "Output frames handed to sessions", registry=r)
        self.sessions_started = Counter(
            "pplex_sessions_started_total", "Connections accepted, by protocol", ["protocol"], registry=r
        )
        self.sessions_ended = Counter(
            "pplex_sessions_ended_total",
            "Connections ended, by protocol and outcome",
            ["protocol", "outcome"],
            registry=r,
        )
        self.resumes = Counter(
            "pplex_resumes_total",
            "Resumes of a conversation whose connection dropped (--resume-seconds), by outcome: resumed, expired "
            "(nobody came back in time), refused (it had ended), wrong_token (unknown, used or expired)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("resumed", "expired", "refused", "wrong_token"):
            self.resumes.labels(outcome)  # (each at 0 from the start)
        self.refused = Counter(
            "pplex_refused_total",
            "Requests and WebSocket upgrades refused at the door (401, 403, 429), by reason",
            ["reason"],
            registry=r,
        )
        self.errors = Counter("pplex_errors_total", "Errors, by kind", ["kind"], registry=r)
        self.transcriber_failures = Counter(
            "pplex_transcriber_failures_total",
            "Ticks whose transcriber step failed: the caller's words of that tick lost, the conversations went on",
            registry=r,
        )
        self.voice_uploads = Counter(
            "pplex_voice_uploads_total",
            "Voice uploads by outcome (added, deleted, client_gone, or the HTTP status of the refusal)",
            ["outcome"],
            registry=r,
        )
        self.records_written = Counter(
            "pplex_records_written_total", "Call records written whole (--record)", registry=r
        )
        self.records_failed = Counter(
            "pplex_records_failed_total",
            "Call records cut short by a write that failed or a disk that did not "
            "answer in time (their calls went on, unrecorded from there)",
            registry=r,
        )
        self.record_frames_lost = Counter(
            "pplex_record_frames_lost_total",
            "Frames left out of call records because the disk fell behind by more "
            "than the recorders buffer (silence stands in for them)",
            registry=r,
        )
        self.records_deleted = Counter(
            "pplex_records_deleted_total",
            "Call records deleted, by reason (retention, quota, request)",
            ["reason"],
            registry=r,
        )
        # Conversation quality (docs/OPERATIONS.md), on the model's timeline.  No labels: the protocol would
        # multiply each histogram's series by ten for little (a session's figures name its protocol).
        self.response_latency = Histogram(
            "pplex_response_latency_seconds",
            "The caller's end of speech -> the agent's start of speech, one per response",
            buckets=_RESPONSE_BUCKETS,
            registry=r,
        )
        self.talk_over = Histogram(
            "pplex_talk_over_seconds",
            "Seconds both the caller and the agent spoke, one per conversation at its end",
            buckets=_CONVERSATION_SECONDS_BUCKETS,
            registry=r,
        )
        # The same two from the transcriber's end of turn (--transcribe with the head), beside the VAD's.
        self.response_latency_turn = Histogram(
            "pplex_response_latency_turn_seconds",
            "The model's end of the caller's turn -> the agent's start of speech, one per response (--transcribe)",
            buckets=_RESPONSE_BUCKETS,
            registry=r,
        )
        self.talk_over_turn = Histogram(
            "pplex_talk_over_turn_seconds",
            "Seconds the agent spoke within the caller's turns (the transcriber's), one per conversation at its end",
            buckets=_CONVERSATION_SECONDS_BUCKETS,
            registry=r,
        )
        self.dead_air = Histogram(
            "pplex_dead_air_seconds",
            "Seconds both were silent after the caller's end of speech, one per conversation at its end",
            buckets=_CONVERSATION_SECONDS_BUCKETS,
            registry=r,
        )
        self.agent_share = Histogram(
            "pplex_agent_speaking_share",
            "The agent's share of a conversation's frames spent speaking, at its end",
            buckets=_SHARE_BUCKETS,
            registry=r,
        )
        self.barge_ins = Counter(
            "pplex_barge_ins_total", "The caller spoke over the agent and the agent stopped within 480 ms", registry=r
        )
        self.webrtc_calls_ended = Counter(
            "pplex_webrtc_calls_ended_total",
            "WebRTC calls ended, by why their peer connection ended (the session's outcome is in "
            "pplex_sessions_ended_total)",
            ["reason"],
            registry=r,
        )
        self.webrtc_packets = Counter(
            "pplex_webrtc_packets_total",
            "WebRTC callers' audio packets: received; lost and recovered from the next one's FEC, or concealed "
            "(Opus PLC); come too late to be heard; dropped, unread by a session a second behind",
            ["kind"],
            registry=r,
        )
        self.trio_tasks = Gauge(
            "pplex_trio_tasks", "Trio tasks alive in the server (counted when /metrics is read)", registry=r
        )

        # Known label values start at zero, so dashboards see them before the first event.
        for reason in DROP_REASONS:
            self.frames_dropped.labels(reason)
        for direction in ("input", "output"):
            self.silence_skipped.labels(direction)
        for kind in ERROR_KINDS:
            self.errors.labels(kind)
        for reason in REFUSAL_REASONS:
            self.refused.labels(reason)
        for reason in RECORD_DELETIONS:
            self.records_deleted.labels(reason)
        for kind in WEBRTC_PACKET_KINDS:
            self.webrtc_packets.labels(kind)

    def drop(self, reason: str, count: int = 1) -> None:
        """Count ``count`` dropped frames under ``reason`` (one of ``DROP_REASONS``)."""
        if count:
            self.frames_dropped.labels(reason).inc(count)

    def render(self) -> bytes:
        """Every metric of this registry in Prometheus' text format, for ``GET /metrics``."""
        return generate_latest(self.registry)
