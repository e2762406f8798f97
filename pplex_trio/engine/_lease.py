"""The session's end of a lease: one conversation's claim on an engine slot, as its session holds it.

A :class:`Lease` pushes input, reads output, flushes, restarts and ends;
it reads where its conversation stands (:class:`LeaseState`, moved only
through :data:`LEASE_LIFECYCLE`).  The engine holds the other end,
:class:`~pplex_trio.engine._engine_lease.EngineLease`, over the same
:class:`~pplex_trio.engine._lease_core.LeaseCore` (as Trio's memory channels
are two ends over one state): the session's end has none of the engine's
methods, so mypy refuses a session that calls ``deliver`` or ``drained``.
:func:`open_lease` makes both ends.  Everything runs on the Trio thread and
is synchronous, except waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from .._conversation import Conversation
from ._engine_lease import EngineLease, LeaseOwner
from ._framing import InputFramer
from ._lease_core import GONE_STATES, PAUSABLE_STATES, LeaseCore, LeaseFailed, LeaseState, LeaseView
from ._outbox import OutputBatches, OutputFrame

logger = logging.getLogger(__name__)


def open_lease(
    conversation: Conversation,
    owner: LeaseOwner,
    *,
    framer: InputFramer,
    output_capacity: int,
    early_audio: bool = False,
    client: str | None = None,
    on_frame: Callable[[OutputFrame], None] | None = None,
) -> tuple[Lease, EngineLease]:
    """A new lease's two ends: the session's and the engine's (``on_frame``: see :class:`EngineLease`)."""
    core = LeaseCore(
        conversation, framer=framer, output_capacity=output_capacity, client=client, count_drop=owner.count_drop
    )
    engine_end = EngineLease(core, owner, on_frame)
    return Lease(core, owner, engine_end, early_audio=early_audio), engine_end


class Lease(LeaseView):
    """One conversation's claim on an engine slot, as its session holds it.

    The session reads ``state``, ``position`` (in the queue) and ``failure``,
    and waits for any of them to change with :meth:`wait_changed`; pushes input
    with :meth:`push_input`; reads output with ``async for batch in
    lease.frames()``; :meth:`flush` asks for an :class:`OutputEnd` once every
    pending input frame has had its answer; :meth:`restart` runs the system
    prompt again with new settings; :meth:`end` gives the slot back;
    :meth:`pause` parks it with its owner, for a new connection to :meth:`resume`.
    """

    def __init__(self, core: LeaseCore, owner: LeaseOwner, engine_end: EngineLease, *, early_audio: bool):
        super().__init__(core)
        self._owner = owner
        self._engine_end = engine_end  # how it names itself to its owner
        self._early_audio = early_audio
        self._overflow_logged = False
        self._let_go = False  # paused: the lease is no longer this end's (a resume makes a new end)

    @property
    def early_audio_kept(self) -> bool:
        """Whether audio pushed before LIVE waits for the model (see :meth:`push_input`)."""
        return self._core.framer.early_samples > 0

    async def wait_changed(self) -> None:
        """Wait until state, position or failure changes (output is read from :meth:`frames`)."""
        await self._core.lot.park()

    def push_input(self, pcm: np.ndarray, arrived_at: float) -> bool:
        """Queue input PCM that reached the server at ``arrived_at``; False when it is dropped.

        Before LIVE, a lease made with ``early_audio`` keeps the last few
        seconds of it for the model (queued ahead of the live audio when the
        conversation goes live; see ``InputFramer.keep_early``); otherwise
        input before LIVE is audio the model was never going to hear (the
        client should wait for the handshake).  On overflow the oldest frames
        go.  After a flush nothing is taken.

        Error handling: :class:`LeaseFailed` for a FAILED lease.
        """
        core = self._core
        if core.state is LeaseState.FAILED:
            assert core.failure is not None
            raise LeaseFailed(core.failure)
        if core.input_ended or core.state in GONE_STATES:
            return False
        if core.state not in (LeaseState.READY, LeaseState.LIVE):
            if not self._early_audio:
                return False
            self._count_overflow(core.framer.keep_early(pcm, arrived_at))
            return True
        self._count_overflow(core.framer.push(pcm, arrived_at))
        self._owner.input_arrived(self._engine_end, pcm.size, arrived_at)
        return True

    def flush(self) -> None:
        """No more input: pad the last frame, and end the output once everything is answered (a flush before
        LIVE takes effect when the conversation goes live)."""
        core = self._core
        if core.input_ended:
            return
        core.input_ended = True
        if core.state in (LeaseState.READY, LeaseState.LIVE):
            core.start_flushing()

    def frames(self) -> OutputBatches:
        """Output events, in batches of everything waiting (at least one); ends when the lease does."""
        return OutputBatches(self._core.outbox, self._skipped_output)

    async def sleep_until_handshake(self) -> None:
        """Sleep until the moment to send the handshake: just before one of the next ticks, by the lead the
        clients need (see ``TickSchedule.sleep_until_handshake``); the first page after it is timed."""
        await self._owner.sleep_until_handshake(self._engine_end)

    def restart(self, conversation: Conversation) -> bool:
        """Run the system prompt again with ``conversation`` (its persona, voice, sampling) in the same slot:
        a persona change without leaving.  What the client says meanwhile is kept for the model as before its
        first handshake (``early_audio``).  False when it is too late (the input has ended, or the
        conversation is over)."""
        core = self._core
        if core.state is LeaseState.QUEUED:
            core.conversation = conversation  # nothing has run yet
            return True
        if (
            core.state not in (LeaseState.STARTING, LeaseState.PREFILL, LeaseState.READY, LeaseState.LIVE)
            or core.input_ended
        ):
            return False
        if core.state in (LeaseState.READY, LeaseState.LIVE):
            core.framer.back_to_early()
        core.conversation = conversation
        core.restarts += 1  # an engine call in flight for the old settings no longer counts
        if core.state is not LeaseState.STARTING:
            core.prompt_since = self._owner.clock()
            core.move(LeaseState.STARTING)
        self._owner.lease_changed(self._engine_end)
        return True

    def begin(self) -> None:
        """Step it from the next tick on without waiting for its caller's first frame (the caller asked the
        model to speak first: a Realtime ``response.create``)."""
        if self._core.state is LeaseState.READY:
            self._core.move(LeaseState.LIVE)
            self._owner.lease_changed(self._engine_end)

    def end(self, *, client_left: bool = False) -> None:
        """The conversation is over: give the slot back (it drains before anyone else gets it).

        ``client_left``: it ended because the client left (not by the server's doing), so the slot may be held
        a moment for the same client to come back (a persona change).
        """
        if self._let_go:
            return  # paused: the actor ends it when its window lapses, or a new connection has it
        # Nothing is observed after the end: an observer kept would keep whoever holds it (the session, its socket
        # and backlogs) in a cycle for the collector the server runs rarely (serve's _quiet_garbage_collector).
        self._engine_end.stop_observing()
        if self._core.state not in GONE_STATES:
            self._owner.lease_ended(self._engine_end, client_left)

    def pause(self) -> bool:
        """The client's connection dropped without ending the call: keep the conversation (its slot, its
        model state) for a resume, and let go of it; this end does nothing more.  False when it cannot be
        paused (resuming is off, its input has ended, it is not under way): then the caller ends it."""
        core = self._core
        if self._let_go or core.input_ended or core.state not in PAUSABLE_STATES:
            return False
        until = self._owner.lease_paused(self)
        if until is None:
            return False
        self._engine_end.stop_observing()
        self._engine_end.paused(until)
        self._let_go = True
        return True

    def resume(self, on_frame: Callable[[OutputFrame], None] | None) -> Lease:
        """A paused lease, taken over by a new connection: a new end over the same conversation (this one stays
        let go), stepped again from the next tick with its model state as it was; ``on_frame`` observes it."""
        assert self._let_go and self._core.state is LeaseState.PAUSED, "only a paused lease resumes"
        self._engine_end.resumed(on_frame)
        self._owner.lease_changed(self._engine_end)
        return Lease(self._core, self._owner, self._engine_end, early_audio=self._early_audio)

    def lapse(self) -> None:
        """A paused lease nobody resumed in time (or one the server ended meanwhile): given back, as :meth:`end`."""
        if self._core.state not in GONE_STATES:
            self._owner.lease_ended(self._engine_end, False)

    # -- inside --------------------------------------------------------------

    def _count_overflow(self, frames: int) -> None:
        """Input beyond the backlog: the oldest frames went (counted; said once a conversation)."""
        if not frames:
            return
        self._owner.count_drop("input_backlog", frames)
        if not self._overflow_logged:
            self._overflow_logged = True
            logger.info(
                "slot %s: more input came at once than its backlog holds; the oldest %d frame(s) were "
                "dropped (--input-backlog-seconds)",
                self._core.slot,
                frames,
            )

    def _skipped_output(self, frames: int) -> None:
        self._core.output_skipped += frames
        self._owner.silence_skipped("output", frames * self._core.framer.frame_size)
