"""The engine actor's settings: one typed object, each default written once."""

from __future__ import annotations

import dataclasses

from .._setting import check_settings, setting

TICK_SECONDS = 0.080  # one Mimi frame
OFF_GPU_SLOTS = 4
"""``--slots auto`` where there is no GPU memory to size by (the CPU, the echo engine)."""


@dataclasses.dataclass
class ActorSettings:
    """What the engine actor needs to know; the server's settings extend it."""

    queue_size: int = setting(16, "connections that may wait for a slot", low=0, group="conversations")
    input_backlog_seconds: float = setting(
        4.0, "a conversation's input that may wait for the engine: a burst after a network stall, or what a "
        "client said before its conversation was live, is kept and caught up with over the caller's pauses (its "
        "silent frames are skipped); beyond this the oldest goes", low=0.08, high=60, group="conversations",
        advanced=True, metavar="SECONDS")
    output_backlog_seconds: float = setting(
        4.0, "a conversation's output that may wait for a client whose reading stalled: once it reads again, the "
        "model's silent frames go first, so its words arrive without lasting delay; beyond this the oldest goes "
        "(its text goes out with the next frame)", low=0.08, high=60, group="conversations", advanced=True,
        metavar="SECONDS")
    first_frame_timeout: float = setting(
        3.0, "a conversation is stepped from its caller's first frame on, so its first words reach a client that "
        "listens; a client that sends nothing this long after the handshake is stepped anyway (it only listens)",
        low=0, group="conversations", advanced=True, metavar="SECONDS")
    input_grace_ms: float = setting(
        4.0, "with aligned framing, a tick may wait this long for a conversation's page that is due, rather "
        "than feed it a silent frame and a tick of delay (at most 3 ticks in 2 s); 0 turns it off",
        low=0, high=40, group="timing", advanced=True)
    early_start_ms: float = setting(
        10.0, "a tick may start up to this long before it is due, as soon as every conversation that is "
        "streaming has its next frame (the deadlines do not move, so ticks come no more often); 0 turns it off",
        low=0, high=40, group="timing", advanced=True)
    engine_timeout: float = setting(
        10.0, "seconds before an engine step that has not returned is stalled: its conversations end (1011), "
        "new ones are refused until it returns", low=0.1,
        group="conversations")
    tick_seconds: float = setting(TICK_SECONDS, "the lockstep period (Mimi's frame)", low=0.001, cli=False)

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def input_backlog_frames(self) -> int:
        return max(1, round(self.input_backlog_seconds / self.tick_seconds))

    @property
    def output_backlog_frames(self) -> int:
        return max(1, round(self.output_backlog_seconds / self.tick_seconds))
