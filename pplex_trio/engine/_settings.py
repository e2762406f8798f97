"""The engine actor's settings: one typed object, each default written once."""

from __future__ import annotations

import dataclasses

from .._conversation import FRAME_SECONDS
from .._setting import check_settings, setting

OFF_GPU_SLOTS = 4
"""``--slots auto`` where there is no GPU memory to size by (the CPU, the echo engine)."""


@dataclasses.dataclass
class ActorSettings:
    """What the engine actor needs to know; the server's settings extend it."""

    queue_size: int = setting(16, "connections that may wait for a slot", low=0, group="conversations")
    input_backlog_seconds: float = setting(
        4.0,
        "a conversation's input that may wait for the engine: a burst after a network stall, or what a "
        "client said before its conversation was live, is kept and caught up with over the caller's pauses (its "
        "silent frames are skipped); beyond this the oldest goes",
        low=FRAME_SECONDS,
        high=60,
        group="conversations",
        advanced=True,
        metavar="SECONDS",
    )
    output_backlog_seconds: float = setting(
        4.0,
        "a conversation's output that may wait for a client whose reading stalled: once it reads again, the "
        "model's silent frames go first, so its words arrive without lasting delay; beyond this the oldest goes "
        "(its text goes out with the next frame)",
        low=FRAME_SECONDS,
        high=60,
        group="conversations",
        advanced=True,
        metavar="SECONDS",
    )
    first_frame_timeout: float = setting(
        3.0,
        "a conversation is stepped from its caller's first frame on, so its first words reach a client that "
        "listens; a client that sends nothing this long after the handshake is stepped anyway (it only listens)",
        low=0,
        group="conversations",
        advanced=True,
        metavar="SECONDS",
    )
    input_grace_ms: float = setting(
        4.0,
        "with aligned framing, a tick may wait this long for a conversation's page that is due, rather "
        "than feed it a silent frame and a tick of delay (at most 3 ticks in 2 s); 0 turns it off",
        low=0,
        high=40,
        group="timing",
        advanced=True,
    )
    early_start_ms: float = setting(
        10.0,
        "a tick may start up to this long before it is due, as soon as every conversation that is "
        "streaming has its next frame (the deadlines do not move, so ticks come no more often); 0 turns it off",
        low=0,
        high=40,
        group="timing",
        advanced=True,
    )
    resume_seconds: float = setting(
        20.0,
        "a conversation whose connection drops without ending the call is paused this long, its slot held and its "
        "model state kept, for its client to resume it with its token (docs/PROTOCOL.md); 0 turns it off: a "
        "dropped connection ends its conversation",
        low=0,
        high=600,
        group="conversations",
        advanced=True,
        metavar="SECONDS",
    )
    engine_timeout: float = setting(
        10.0,
        "seconds before an engine step that has not returned is stalled: its conversations end (1011), "
        "new ones are refused until it returns",
        low=0.1,
        group="conversations",
    )
    tick_seconds: float = setting(FRAME_SECONDS, "the lockstep period (Mimi's frame)", low=0.001, cli=False)
    # The windows the timing looks back over, in seconds: the tick schedule turns each into ticks
    # (``TickSchedule.in_ticks``), so a different ``tick_seconds`` keeps their lengths.  Tuned with the code, not
    # per server: not on the command line.
    input_grace_window: float = setting(
        2.0, "the input grace holds at most 3 ticks in any window this long", low=0.001, cli=False
    )
    steering_window: float = setting(
        10.0,
        "the grid's steering moves earlier by the smallest slack seen in this long (a client's rhythm and "
        "a jittery network's late pages come round in it)",
        low=0.001,
        cli=False,
    )
    steering_calm: float = setting(
        6.0, "this long without a late page narrows the steering's margin a step", low=0.001, cli=False
    )
    framer_window: float = setting(
        2.0,
        "aligned framing skips the surplus that every tick of this window had; a conversation a frame "
        "behind for this long catches up over its silence",
        low=0.001,
        cli=False,
    )
    framer_hold: float = setting(
        4.0, "after a tick found no whole frame, aligned framing skips nothing for this long", low=0, cli=False
    )
    work_starved: float = setting(
        2.0, "work between ticks that found no room for this long gets a small call anyway", low=0.001, cli=False
    )

    def __post_init__(self) -> None:
        check_settings(self)
