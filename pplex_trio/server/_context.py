"""What every request handler of one server shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import trio

from .._conversation import Outcome
from .._metrics import WEBRTC_PACKET_KINDS, Metrics
from ..engine import Engine, EngineActor
from ..protocol import ClientSecrets
from ._encoders import Encoders, make_encoders
from ._server_state import SERVER_LIFECYCLE, ServerState, Unready
from ._settings import ServerSettings
from .records import RecordStore
from .sessions import Session
from .voices import VoiceStore, default_folder
from .webrtc import CallDesk


@dataclasses.dataclass(eq=False)
class ServerContext:
    """What every request handler of one server shares: settings, engine and its actor, metrics, encoders, stores, the
    live sessions, the client secrets and the server's state.
    """

    settings: ServerSettings
    engine: Engine
    actor: EngineActor
    metrics: Metrics
    encoders: Encoders
    voice_store: VoiceStore | None = None  # voices added over HTTP (None: this server keeps none)
    records: RecordStore | None = None  # the call records (None: --record is off)
    sessions: set[Session] = dataclasses.field(default_factory=set)
    client_secrets: ClientSecrets = dataclasses.field(default_factory=ClientSecrets)  # minted for pages to hold
    calls: CallDesk | None = None  # the WebRTC calls (serve runs the desk)
    state: ServerState = SERVER_LIFECYCLE.start  # moved only by begin_drain and begin_shutdown
    _drain_scope: trio.CancelScope | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def create(cls, settings: ServerSettings, engine: Engine) -> ServerContext:
        """A new server's context, as the settings ask."""
        metrics = Metrics()
        actor = EngineActor(engine, settings, metrics=metrics)
        encoders = make_encoders(settings.opus_encoder, settings.inline_encoders)
        store = VoiceStore(settings.voice_store or default_folder(engine.name))
        engine.use_voice_store(store.folder)
        packets = {kind: metrics.webrtc_packets.labels(kind) for kind in WEBRTC_PACKET_KINDS}  # (each call counts)
        records = (
            None
            if settings.record_dir is None
            else RecordStore(
                settings.record_dir,
                retention_days=settings.record_retention_days,
                quota=settings.record_quota,
                metrics=metrics,
            )
        )
        return cls(
            settings=settings,
            engine=engine,
            actor=actor,
            metrics=metrics,
            encoders=encoders,
            voice_store=store,
            records=records,
            calls=CallDesk(
                ports=settings.webrtc_port_range,
                host=settings.webrtc_host,
                max_message_bytes=settings.max_message_bytes,
                on_end=lambda reason: metrics.webrtc_calls_ended.labels(reason.value).inc(),
                on_packets=lambda kind, count: packets[kind].inc(count),
            ),
        )

    def voices(self) -> Sequence[str]:
        """The voices a conversation may name: the model's own, then those added over HTTP."""
        own = list(self.engine.voices())
        return own + [name for name in self.added_voices() if name not in own]

    def added_voices(self) -> list[str]:
        """The names of the voices added over HTTP (none when the server keeps no voice store)."""
        return self.voice_store.names() if self.voice_store is not None else []

    def unready(self, *, when_full: bool = True) -> Unready | None:
        """Why the server cannot take a conversation now (None: it can): what ``/ready`` and ``/health`` say,
        and why a conversation is refused (``when_full=False``: the queue answers for a full server)."""
        if self.state is ServerState.STOPPING:
            return Unready.SHUTTING_DOWN
        if self.state is ServerState.DRAINING:
            return Unready.DRAINING
        if self.actor.stalled:
            return Unready.ENGINE_STALLED
        stats = self.actor.statistics()
        if when_full and stats.slots_free == 0 and stats.queued >= self.settings.queue_size:
            return Unready.FULL
        return None

    def _enter(self, state: ServerState) -> bool:
        """Move to ``state`` if the lifecycle has that move from here (False: it has not, nothing changes)."""
        if not SERVER_LIFECYCLE.allows(self.state, state):
            return False
        self.state = SERVER_LIFECYCLE.move(self.state, state)
        return True

    def begin_drain(self, scope: trio.CancelScope) -> bool:
        """Take no new conversations; the live ones go on (``--drain-seconds``) until ``scope`` is cancelled.
        False if the server is draining or stopping already."""
        if not self._enter(ServerState.DRAINING):
            return False
        self._drain_scope = scope
        return True

    def end_drain(self) -> None:
        """Cut the drain short (a second signal): the shutdown follows."""
        if self._drain_scope is not None:
            self._drain_scope.cancel()

    def begin_shutdown(self) -> bool:
        """Close every conversation with 1001 (going away); refuse new ones.  False if stopping already."""
        if not self._enter(ServerState.STOPPING):
            return False
        for session in list(self.sessions):
            session.end(Outcome.SHUTDOWN, Unready.SHUTTING_DOWN.message)
        self.actor.resumes.lapse_all()  # (the paused calls end too: their records are finished)
        return True
