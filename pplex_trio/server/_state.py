"""What every request handler of one server shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import trio

from .._conversation import CloseCode
from .._metrics import Metrics
from ..engine import Engine, EngineActor
from ._encoders import Encoders, make_encoders
from ._session import UNREADY_MESSAGES, Session
from ._settings import ServerSettings
from ._voice_store import VoiceLimits, VoiceStore, default_folder


@dataclasses.dataclass(eq=False)
class ServerState:
    settings: ServerSettings
    engine: Engine
    actor: EngineActor
    metrics: Metrics
    encoders: Encoders
    voice_store: VoiceStore | None = None  # voices added over HTTP (None: this server keeps none)
    sessions: set[Session] = dataclasses.field(default_factory=set)
    shutting_down: bool = False
    draining: bool = False
    _drain_scope: trio.CancelScope | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def create(cls, settings: ServerSettings, engine: Engine, *, encoders: Encoders | None = None,
               voice_limits: VoiceLimits | None = None) -> ServerState:
        """The state of a new server; ``encoders`` replaces the ``--opus-encoder`` choice (benchmarks),
        ``voice_limits`` the voice store's defaults (tests)."""
        metrics = Metrics()
        actor = EngineActor(engine, settings, metrics=metrics)
        if encoders is None:
            encoders = make_encoders(settings.opus_encoder, settings.inline_encoders)
        store = VoiceStore(settings.voice_store or default_folder(engine.name), voice_limits)
        engine.use_voice_store(store.folder)
        return cls(settings=settings, engine=engine, actor=actor, metrics=metrics, encoders=encoders,
                   voice_store=store)

    def voices(self) -> Sequence[str]:
        """The voices a conversation may name: the model's own, then those added over HTTP."""
        own = list(self.engine.voices())
        return own + [name for name in self.added_voices() if name not in own]

    def added_voices(self) -> list[str]:
        return self.voice_store.names() if self.voice_store is not None else []

    def unready_reason(self) -> str | None:
        """Why the server cannot take a conversation now (None: it can); what ``/ready`` says."""
        if self.shutting_down:
            return "shutting_down"
        if self.draining:
            return "draining"
        if self.actor.stalled:
            return "engine_stalled"
        stats = self.actor.statistics()
        if stats.slots_free == 0 and stats.queued >= self.settings.queue_size:
            return "full"
        return None

    def begin_drain(self, scope: trio.CancelScope) -> None:
        """Take no new conversations; the live ones go on (``--drain-seconds``) until ``scope`` is cancelled."""
        self.draining = True
        self._drain_scope = scope

    def end_drain(self) -> None:
        """Cut the drain short (a second signal): the shutdown follows."""
        if self._drain_scope is not None:
            self._drain_scope.cancel()

    def begin_shutdown(self) -> None:
        """Close every conversation with 1001 (going away); refuse new ones."""
        self.shutting_down = True
        for session in list(self.sessions):
            session.end(CloseCode.GOING_AWAY, "server is shutting down", "shutdown")
