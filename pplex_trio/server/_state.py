"""What every request handler of one server shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from .._metrics import Metrics
from ..engine import Engine, EngineActor
from ..codec._pools import (
    EncoderPool,
    ProcessEncoderPool,
    make_encoder_pool,
)
from ._reaction import DEFAULT_REACTION, ClientReaction
from ._settings import ServerSettings

if TYPE_CHECKING:
    from ._session import Session


@dataclasses.dataclass(eq=False)
class ServerState:
    settings: ServerSettings
    engine: Engine
    actor: EngineActor
    metrics: Metrics
    encoder_pool: EncoderPool | ProcessEncoderPool = dataclasses.field(default_factory=EncoderPool)
    sessions: set[Session] = dataclasses.field(default_factory=set)
    shutting_down: bool = False
    sessions_gone: trio.Event = dataclasses.field(default_factory=trio.Event)
    client_reaction: ClientReaction = dataclasses.field(default_factory=ClientReaction)

    @classmethod
    def create(cls, settings: ServerSettings, engine: Engine) -> ServerState:
        metrics = Metrics()
        metrics.client_reaction.set(DEFAULT_REACTION)
        actor = EngineActor(
            engine,
            metrics=metrics,
            queue_size=settings.queue_size,
            input_backlog_frames=settings.input_backlog_frames,
            output_backlog_frames=settings.output_backlog_frames,
            input_grace=settings.input_grace,
        )
        return cls(settings=settings, engine=engine, actor=actor, metrics=metrics,
                   encoder_pool=make_encoder_pool(settings.opus_encoder, settings.inline_encoders))

    def voices(self) -> Sequence[str]:
        return self.engine.voices()

    def begin_shutdown(self) -> None:
        """Close every conversation with 1001 (going away); refuse new ones."""
        from ..protocol import CloseCode

        self.shutting_down = True
        for session in list(self.sessions):
            session.end(CloseCode.GOING_AWAY, "server is shutting down", "shutdown")
