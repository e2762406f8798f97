"""What every request handler of one server shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .._conversation import CloseCode
from .._metrics import Metrics
from ..engine import Engine, EngineActor
from ._encoders import Encoders, make_encoders
from ._reaction import DEFAULT_REACTION, ClientReaction
from ._session import Session
from ._settings import ServerSettings


@dataclasses.dataclass(eq=False)
class ServerState:
    settings: ServerSettings
    engine: Engine
    actor: EngineActor
    metrics: Metrics
    encoders: Encoders
    sessions: set[Session] = dataclasses.field(default_factory=set)
    shutting_down: bool = False
    client_reaction: ClientReaction = dataclasses.field(default_factory=ClientReaction)

    @classmethod
    def create(cls, settings: ServerSettings, engine: Engine, *, encoders: Encoders | None = None) -> ServerState:
        """The state of a new server; ``encoders`` replaces the ``--opus-encoder`` choice (benchmarks)."""
        metrics = Metrics()
        metrics.client_reaction.set(DEFAULT_REACTION)
        actor = EngineActor(engine, settings, metrics=metrics)
        if encoders is None:
            encoders = make_encoders(settings.opus_encoder, settings.inline_encoders)
        return cls(settings=settings, engine=engine, actor=actor, metrics=metrics, encoders=encoders)

    def voices(self) -> Sequence[str]:
        return self.engine.voices()

    def begin_shutdown(self) -> None:
        """Close every conversation with 1001 (going away); refuse new ones."""
        self.shutting_down = True
        for session in list(self.sessions):
            session.end(CloseCode.GOING_AWAY, "server is shutting down", "shutdown")
