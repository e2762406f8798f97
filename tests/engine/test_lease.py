"""A lease's lifecycle: one enum, its moves in one table, and what each state refuses; the slot table that
asks and tells it (admission, the queue, a slot held for the client that left it, a prompt run again)."""

from __future__ import annotations

import numpy as np
import pytest

from pplex_trio._conversation import CloseCode, Conversation
from pplex_trio._lifecycle import IllegalTransition
from pplex_trio.engine import LEASE_LIFECYCLE, LeaseFailed, LeaseState, OutputEnd, OutputFrame
from pplex_trio.engine._engine_call import plan_call
from pplex_trio.engine._engine_lease import EngineLease
from pplex_trio.engine._framing import InputFramer
from pplex_trio.engine._lease import Lease, open_lease
from pplex_trio.engine._lease_core import LeaseFailure
from pplex_trio.engine._slots import RETURN_WINDOW, SlotTable

FRAME = 1920
S = LeaseState


class Owner:
    """What the actor would be to a lease: here, a clock and the table."""

    def __init__(self, table: SlotTable):
        self.table = table
        self.now = 0.0
        self.restarted: list[EngineLease] = []

    def clock(self):
        return self.now

    def input_arrived(self, lease, samples, arrived_at):
        pass

    async def sleep_until_handshake(self, lease):
        pass

    def lease_ended(self, lease, client_left):
        self.table.release(lease, self.now, client_left=client_left)

    def lease_changed(self, lease):
        self.restarted.append(lease)

    def count_drop(self, reason, count):
        pass

    def silence_skipped(self, direction, samples):
        pass


def new_lease(owner: Owner, *, early_audio: bool = False, client: str | None = None) -> tuple[Lease, EngineLease]:
    """A lease's two ends, as the actor makes them: the session's, and the engine's (in the table)."""
    lease, engine = open_lease(
        Conversation(),
        owner,
        framer=InputFramer(FRAME, 4, window=25, hold_after_underrun=50),
        output_capacity=8,
        early_audio=early_audio,
        client=client,
    )
    owner.table.request(engine, owner.now)
    return lease, engine


def output(tick: int) -> OutputFrame:
    return OutputFrame(pcm=np.zeros(FRAME, np.float32), text=None, tick=tick)


def between_calls(owner: Owner) -> list[int]:
    """What the actor does between engine calls: free what drained, admit who waits; the rows to reset."""
    reset = owner.table.free_drained(owner.now)
    owner.table.admit_waiting(owner.now)
    return reset


def test_the_moves_a_lease_may_make():
    moves = LEASE_LIFECYCLE.moves
    assert moves[S.QUEUED] == {S.QUEUED, S.STARTING, S.ENDED}
    assert moves[S.STARTING] == {S.PREFILL, S.READY, S.FLUSHING, S.FAILED, S.DRAINING}
    assert moves[S.PREFILL] == {S.STARTING, S.READY, S.FLUSHING, S.FAILED, S.DRAINING}
    assert moves[S.READY] == {S.STARTING, S.LIVE, S.PAUSED, S.FLUSHING, S.FAILED, S.DRAINING}  # (LIVE: its first step)
    assert moves[S.LIVE] == {S.STARTING, S.PAUSED, S.FLUSHING, S.FAILED, S.DRAINING}  # (STARTING: the prompt again)
    assert moves[S.PAUSED] == {S.LIVE, S.FAILED, S.DRAINING}  # (LIVE: resumed; DRAINING: its window lapsed)
    assert moves[S.FLUSHING] == {S.FLUSHED, S.FAILED, S.DRAINING}
    assert moves[S.FAILED] == {S.DRAINING, S.ENDED} and moves[S.DRAINING] == {S.HELD, S.ENDED}
    assert moves[S.HELD] == {S.ENDED} and moves[S.ENDED] == set()
    assert set(moves) == set(LeaseState)


def test_each_end_has_only_its_own_side():
    """Two thin ends over one core: what the engine is told is not the session's to call, nor the reverse
    (tests/test_types.py: mypy refuses it)."""

    def own(end: type) -> set[str]:
        return {name for name in vars(end) if not name.startswith("_")}

    assert not own(EngineLease) & set(dir(Lease)) and not own(Lease) & set(dir(EngineLease))
    assert {"deliver", "drained", "take_frame", "fail"} <= own(EngineLease)
    assert {"push_input", "flush", "frames", "end"} <= own(Lease)


def test_a_move_the_lifecycle_does_not_have_is_refused():
    owner = Owner(SlotTable(1, queue_size=1))
    lease, engine = new_lease(owner)
    assert engine.started(0, 0.0) and lease.state is S.READY
    engine.first_step()
    with pytest.raises(IllegalTransition, match="lease: no transition from live to queued"):
        engine.queued(1)
    lease.end()
    assert lease.state is S.DRAINING
    lease.end()  # (ending twice is harmless)
    assert between_calls(owner) == [0] and lease.state is S.ENDED and owner.table.rows == [None]


def test_a_failed_lease_refuses_input_with_its_reason_and_its_slot_drains():
    owner = Owner(SlotTable(1, queue_size=1))
    lease, engine = new_lease(owner)
    engine.started(0, 0.0)
    owner.table.fail(0, LeaseFailure(CloseCode.INTERNAL_ERROR, "the model failed"))
    assert lease.state is S.FAILED and lease.failure.message == "the model failed"
    assert owner.table.slot_states(0.0)["draining"] == 1
    with pytest.raises(LeaseFailed, match="the model failed") as info:
        lease.push_input(np.zeros(FRAME, np.float32), 0.0)
    assert info.value.failure.code == CloseCode.INTERNAL_ERROR
    owner.table.fail(0, LeaseFailure(CloseCode.POLICY, "again"))  # (a second failure changes nothing)
    assert lease.failure.message == "the model failed"
    assert between_calls(owner) == [0] and owner.table.free_count(0.0) == 1  # freed before its session ends it
    assert lease.state is S.FAILED  # (the session still has to see why)
    lease.end()
    assert lease.state is S.ENDED


def test_a_live_flush_ends_the_output_once_every_frame_taken_is_answered():
    owner = Owner(SlotTable(1, queue_size=1))
    lease, engine = new_lease(owner)
    engine.started(0, 0.0)
    assert lease.push_input(np.ones(FRAME + 100, np.float32), 0.0)  # (READY takes input, as LIVE does)
    lease.flush()
    assert lease.state is S.FLUSHING  # two frames to answer (the second padded)
    assert not lease.push_input(np.ones(FRAME, np.float32), 0.1)  # nothing after the end of input
    out = np.zeros(FRAME, np.float32)
    for tick in (1, 2):
        engine.take_frame(out, tick, 0.0)
        engine.deliver(output(tick))
    assert lease.state is S.FLUSHED
    engine.deliver(output(3))  # nothing follows the end
    events = lease._core.outbox._items
    assert [type(e) for e, _ in events] == [OutputFrame, OutputFrame, OutputEnd]


def test_a_flush_before_live_takes_effect_when_the_prompt_is_done():
    owner = Owner(SlotTable(1, queue_size=1))
    lease, engine = new_lease(owner, early_audio=True)
    assert lease.push_input(np.ones(FRAME, np.float32), 0.0)  # kept for when it is live
    lease.flush()
    assert lease.state is S.STARTING
    assert not engine.started(3, 0.0) and lease.state is S.PREFILL and engine.prompt_left == 3
    assert engine.prefilled(3, 0.0)
    assert lease.state is S.FLUSHING  # the early frame still to answer
    engine.take_frame(np.zeros(FRAME, np.float32), 1, 0.0)
    engine.deliver(output(1))
    assert lease.state is S.FLUSHED


# -- a slot held for the client that left it ------------------------------------------------------


def test_a_client_that_leaves_gets_its_slot_back_ahead_of_the_queue():
    owner = Owner(SlotTable(1, queue_size=4))
    first, _ = new_lease(owner, client="10.0.0.1")
    waiting, _ = new_lease(owner, client="10.0.0.2")
    assert waiting.state is S.QUEUED
    first.end(client_left=True)  # e.g. LiveKit's plugin reconnecting with a new persona
    owner.now += 0.05
    between_calls(owner)
    assert first.state is S.HELD and owner.table.slot_states(owner.now)["held"] == 1
    assert waiting.state is S.QUEUED and owner.table.free_count(owner.now) == 0  # held, for 10.0.0.1 only
    back, _ = new_lease(owner, client="10.0.0.1")
    assert back.state is S.STARTING and back.slot == 0  # ahead of the one waiting
    assert first.state is S.ENDED and waiting.state is S.QUEUED and waiting.position == 1


def test_a_client_back_while_its_slot_drains_waits_at_the_front():
    owner = Owner(SlotTable(1, queue_size=4))
    first, _ = new_lease(owner, client="a")
    others = [new_lease(owner, client=c)[0] for c in ("b", "c")]
    first.end(client_left=True)
    back, _ = new_lease(owner, client="a")  # before the slot has drained
    assert back.state is S.QUEUED and back.position == 1 and others[1].position == 3
    between_calls(owner)
    assert back.state is S.STARTING and [o.position for o in others] == [1, 2]


def test_a_held_slot_goes_to_the_queue_once_the_window_has_passed():
    owner = Owner(SlotTable(1, queue_size=4))
    first, _ = new_lease(owner, client="a")
    waiting, _ = new_lease(owner, client="b")
    first.end(client_left=True)
    owner.now += RETURN_WINDOW - 0.01
    between_calls(owner)
    assert waiting.state is S.QUEUED and owner.table.next_change() == pytest.approx(RETURN_WINDOW)
    owner.now += 0.02
    assert owner.table.free_count(owner.now) == 1  # (a query: the lapsed hold counts as free, nothing moves)
    assert first.state is S.HELD
    between_calls(owner)
    assert waiting.state is S.STARTING and first.state is S.ENDED


@pytest.mark.parametrize("how", ["server_ended", "no_client", "failed"])
def test_only_a_slot_its_client_left_is_held(how):
    owner = Owner(SlotTable(1, queue_size=4))
    first, _ = new_lease(owner, client=None if how == "no_client" else "a")
    waiting, _ = new_lease(owner, client="b")
    if how == "failed":
        owner.table.fail(0, LeaseFailure(CloseCode.INTERNAL_ERROR, "the model failed"))
    first.end(client_left=how != "server_ended")
    between_calls(owner)
    assert waiting.state is S.STARTING  # nothing held: the queue moves on at once


def test_a_held_slot_does_not_block_the_other_free_ones():
    owner = Owner(SlotTable(2, queue_size=4))
    (first, _), (second, _) = new_lease(owner, client="a"), new_lease(owner, client="b")
    waiting, _ = new_lease(owner, client="c")
    first.end(client_left=True)  # held for "a"
    second.end()  # ended by the server: not held
    between_calls(owner)
    assert waiting.slot == 1  # the free one, not the held one


def test_nothing_is_held_when_nobody_waits():
    owner = Owner(SlotTable(2, queue_size=4))
    new_lease(owner, client="a")[0].end(client_left=True)
    between_calls(owner)
    assert owner.table.free_count(owner.now) == 2  # (/health and /ready see every slot free at once)
    assert owner.table.slot_states(owner.now) == {"free": 2, "prefill": 0, "live": 0, "draining": 0, "held": 0}


# -- the prompt again, in the same slot (a persona change) ----------------------------------------


async def test_a_restart_runs_the_prompt_again_in_the_same_slot_and_keeps_what_was_said():
    owner = Owner(SlotTable(2, queue_size=1))
    lease, engine = new_lease(owner, early_audio=True)
    engine.started(0, 0.0)
    engine.first_step()
    assert lease.state is S.LIVE
    said = np.arange(FRAME + 5, dtype=np.float32)
    lease.push_input(said, 1.0)
    planned = plan_call(owner.table, 0.0)  # an engine call in flight for the old settings ...
    pirate = Conversation(persona="You are a pirate.")
    assert lease.restart(pirate) and owner.restarted == [engine]  # (the owner hears of it by its engine end)
    assert lease.state is S.STARTING and lease.conversation is pirate
    assert planned.lease(owner.table, 0, frozenset({S.STARTING, S.LIVE})) is None  # ... no longer applies
    call = plan_call(owner.table, 0.0)
    assert call.starts == [(0, pirate)]  # its prompt runs anew (the engine's start resets the row)
    lease.push_input(np.full(FRAME, 7.0, np.float32), 1.1)  # said while the prompt runs: kept
    engine.started(4, 0.0)
    engine.prefilled(4, 0.0)
    assert lease.state is S.READY and lease.slot == 0
    out = np.zeros(FRAME, np.float32)
    engine.take_frame(out, 1, 0.0)
    assert np.array_equal(out, said[:FRAME])  # what waited when the prompt began comes first, then the rest
    engine.take_frame(out, 2, 0.0)
    assert np.array_equal(out[:5], said[FRAME:]) and np.all(out[5:] == 7.0)


def test_a_restart_while_queued_changes_the_settings_only_and_none_after_the_end_of_input():
    owner = Owner(SlotTable(1, queue_size=2))
    first, first_engine = new_lease(owner)
    waiting, _ = new_lease(owner)
    pirate = Conversation(persona="You are a pirate.")
    assert waiting.restart(pirate) and waiting.conversation is pirate and waiting.state is S.QUEUED
    first_engine.started(0, 0.0)
    first.flush()
    assert not first.restart(pirate)  # the input has ended: too late


def test_an_ended_lease_lets_its_observer_go():
    """The observer is the session's bound method: a lease that kept it after the end would keep its session
    (socket, backlogs) in a cycle, freed only by a full collection, which the server runs rarely."""
    import gc
    import weakref

    class Session:
        def on_frame(self, frame):
            pass

    owner = Owner(SlotTable(1, queue_size=1))
    session = Session()
    lease, engine = open_lease(
        Conversation(),
        owner,
        framer=InputFramer(FRAME, 4, window=25, hold_after_underrun=50),
        output_capacity=8,
        on_frame=session.on_frame,
    )
    session.lease = lease  # as the server's session holds its lease
    owner.table.request(engine, owner.now)
    lease.end()
    gone = weakref.ref(session)
    gc.disable()
    try:
        del session, lease, engine
        assert gone() is None  # freed at once, by reference counting
    finally:
        gc.enable()
