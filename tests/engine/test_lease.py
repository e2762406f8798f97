"""A lease's lifecycle: one enum, its moves in one table, and what each state refuses."""

from __future__ import annotations

import numpy as np
import pytest

from pplex_trio._conversation import CloseCode, Conversation
from pplex_trio.engine import LeaseFailed, LeaseState, OutputEnd, OutputFrame, SlotPhase
from pplex_trio.engine._framing import InputFramer
from pplex_trio.engine._lease import _LEASE_NEXT, Lease
from pplex_trio.engine._slots import RETURN_WINDOW, SlotTable

FRAME = 1920


class Clock:
    now = 0.0


def new_lease(table: SlotTable, *, early_audio: bool = False, client: str | None = None,
              clock: Clock = Clock()) -> Lease:
    lease = Lease(Conversation(), framer=InputFramer(FRAME, 4), output_capacity=8, on_drop=lambda name, n: None,
                  on_input=lambda lease: None, early_audio=early_audio, client=client,
                  on_end=lambda lease, left: table.release(lease, clock.now, hold=left))
    table.request(lease, clock.now)
    return lease


def output(tick: int) -> OutputFrame:
    return OutputFrame(pcm=np.zeros(FRAME, np.float32), text=None, tick=tick)


def test_the_moves_a_lease_may_make():
    S = LeaseState
    assert _LEASE_NEXT[S.QUEUED] == {S.QUEUED, S.PREFILL, S.FAILED}
    assert _LEASE_NEXT[S.PREFILL] == {S.LIVE, S.FLUSHING, S.FAILED}
    assert _LEASE_NEXT[S.LIVE] == {S.PREFILL, S.FLUSHING, S.FAILED}  # (PREFILL: the prompt again)
    assert _LEASE_NEXT[S.FLUSHING] == {S.FLUSHED, S.FAILED}
    assert _LEASE_NEXT[S.FAILED] == set() and _LEASE_NEXT[S.ENDED] == set()


def test_a_move_the_lifecycle_does_not_have_is_refused():
    table = SlotTable(1, queue_size=1)
    lease = new_lease(table)
    table.started(table.slots[0], 0)
    assert lease.state is LeaseState.LIVE
    with pytest.raises(RuntimeError, match="no transition from live to queued"):
        lease._set(LeaseState.QUEUED)
    lease.end()
    assert lease.state is LeaseState.ENDED  # (ending is always allowed)


def test_a_failed_lease_refuses_input_with_its_reason():
    table = SlotTable(1, queue_size=1)
    lease = new_lease(table)
    table.started(table.slots[0], 0)
    table.fail_slot(table.slots[0], CloseCode.INTERNAL_ERROR, "the model failed")
    assert lease.state is LeaseState.FAILED and lease.failure.message == "the model failed"
    assert table.slots[0].phase is SlotPhase.DRAINING
    with pytest.raises(LeaseFailed, match="the model failed") as info:
        lease.push_input(np.zeros(FRAME, np.float32), 0.0)
    assert info.value.failure.code == CloseCode.INTERNAL_ERROR
    table.fail_slot(table.slots[0], CloseCode.POLICY, "again")  # (a second failure changes nothing)
    assert lease.failure.message == "the model failed"


def test_a_live_flush_ends_the_output_once_every_frame_taken_is_answered():
    table = SlotTable(1, queue_size=1)
    lease = new_lease(table)
    slot = table.slots[0]
    table.started(slot, 0)
    assert lease.push_input(np.ones(FRAME + 100, np.float32), 0.0)
    lease.flush()
    assert lease.state is LeaseState.FLUSHING  # two frames to answer (the second padded)
    assert not lease.push_input(np.ones(FRAME, np.float32), 0.1)  # nothing after the end of input
    out = np.zeros(FRAME, np.float32)
    for tick in (1, 2):
        table.take_input(slot, out, tick)
        table.deliver(slot, output(tick))
    assert lease.state is LeaseState.FLUSHED
    table.deliver(slot, output(3))  # nothing follows the end
    events = lease._outbox._items
    assert [type(e) for e, _ in events] == [OutputFrame, OutputFrame, OutputEnd]


def test_a_flush_before_live_takes_effect_when_the_prompt_is_done():
    table = SlotTable(1, queue_size=1)
    lease = new_lease(table, early_audio=True)
    slot = table.slots[0]
    assert lease.push_input(np.ones(FRAME, np.float32), 0.0)  # kept for when it is live
    lease.flush()
    assert lease.state is LeaseState.PREFILL
    table.started(slot, 3)
    table.prefilled(slot, 3)
    assert lease.state is LeaseState.FLUSHING  # the early frame still to answer
    table.take_input(slot, np.zeros(FRAME, np.float32), 1)
    table.deliver(slot, output(1))
    assert lease.state is LeaseState.FLUSHED


# -- a slot held for the client that left it ------------------------------------------------------


def drain(table: SlotTable, clock: Clock) -> None:
    """What the actor does between engine calls."""
    table.free_drained()
    table.admit_waiting(clock.now)


def test_a_client_that_leaves_gets_its_slot_back_ahead_of_the_queue():
    clock = Clock()
    table = SlotTable(1, queue_size=4)
    first = new_lease(table, client="10.0.0.1", clock=clock)
    waiting = new_lease(table, client="10.0.0.2", clock=clock)
    assert waiting.state is LeaseState.QUEUED
    first.end(client_left=True)  # e.g. LiveKit's plugin reconnecting with a new persona
    clock.now += 0.05
    drain(table, clock)
    assert waiting.state is LeaseState.QUEUED and table.free_count(clock.now) == 0  # held, for 10.0.0.1 only
    back = new_lease(table, client="10.0.0.1", clock=clock)
    assert back.state is LeaseState.PREFILL and back.slot == 0  # ahead of the one waiting
    assert waiting.state is LeaseState.QUEUED and waiting.position == 1


def test_a_client_back_while_its_slot_drains_waits_at_the_front():
    clock = Clock()
    table = SlotTable(1, queue_size=4)
    first = new_lease(table, client="a", clock=clock)
    others = [new_lease(table, client=c, clock=clock) for c in ("b", "c")]
    first.end(client_left=True)
    back = new_lease(table, client="a", clock=clock)  # before the slot has drained
    assert back.state is LeaseState.QUEUED and back.position == 1 and others[1].position == 3
    drain(table, clock)
    assert back.state is LeaseState.PREFILL and [o.position for o in others] == [1, 2]


def test_a_held_slot_goes_to_the_queue_once_the_window_has_passed():
    clock = Clock()
    table = SlotTable(1, queue_size=4)
    first = new_lease(table, client="a", clock=clock)
    waiting = new_lease(table, client="b", clock=clock)
    first.end(client_left=True)
    clock.now += RETURN_WINDOW - 0.01
    drain(table, clock)
    assert waiting.state is LeaseState.QUEUED
    clock.now += 0.02
    drain(table, clock)
    assert waiting.state is LeaseState.PREFILL


@pytest.mark.parametrize("how", ["server_ended", "no_client", "failed"])
def test_only_a_slot_its_client_left_is_held(how):
    clock = Clock()
    table = SlotTable(1, queue_size=4)
    first = new_lease(table, client=None if how == "no_client" else "a", clock=clock)
    waiting = new_lease(table, client="b", clock=clock)
    if how == "failed":
        table.fail_slot(table.slots[0], CloseCode.INTERNAL_ERROR, "the model failed")
    first.end(client_left=how != "server_ended")
    drain(table, clock)
    assert waiting.state is LeaseState.PREFILL  # nothing held: the queue moves on at once


def test_a_held_slot_does_not_block_the_other_free_ones():
    clock = Clock()
    table = SlotTable(2, queue_size=4)
    first, second = new_lease(table, client="a", clock=clock), new_lease(table, client="b", clock=clock)
    waiting = new_lease(table, client="c", clock=clock)
    first.end(client_left=True)  # held for "a"
    second.end()  # ended by the server: not held
    drain(table, clock)
    assert waiting.slot == 1  # the free one, not the held one


def test_nothing_is_held_when_nobody_waits():
    clock = Clock()
    table = SlotTable(2, queue_size=4)
    new_lease(table, client="a", clock=clock).end(client_left=True)
    drain(table, clock)
    assert table.free_count(clock.now) == 2  # (/health and /ready see every slot free at once)


# -- the prompt again, in the same slot (a persona change) ----------------------------------------


def test_a_restart_runs_the_prompt_again_in_the_same_slot_and_keeps_what_was_said():
    from pplex_trio.engine._tick_plan import plan_call

    table = SlotTable(2, queue_size=1)
    lease = new_lease(table, early_audio=True)
    slot = table.slots[0]
    table.started(slot, 0)
    assert lease.state is LeaseState.LIVE
    said = np.arange(FRAME + 5, dtype=np.float32)
    lease.push_input(said, 1.0)
    pirate = Conversation(persona="You are a pirate.")
    assert lease.restart(pirate) and lease.state is LeaseState.LIVE  # (taken at the next engine call)
    call = plan_call(table, 0.0)
    assert call.resets == [0] and call.starts == [(0, pirate)]  # the row reset, its prompt run anew
    assert lease.state is LeaseState.PREFILL and lease.conversation is pirate and slot.phase is SlotPhase.PREFILL
    lease.push_input(np.full(FRAME, 7.0, np.float32), 1.1)  # said while the prompt runs: kept
    table.started(slot, 4)
    table.prefilled(slot, 4)
    assert lease.state is LeaseState.LIVE and lease.slot == 0
    out = np.zeros(FRAME, np.float32)
    table.take_input(slot, out, 1)
    assert np.array_equal(out, said[:FRAME])  # what waited when the prompt began comes first, then the rest
    table.take_input(slot, out, 2)
    assert np.array_equal(out[:5], said[FRAME:]) and np.all(out[5:] == 7.0)


def test_a_restart_while_queued_changes_the_settings_only_and_none_after_the_end_of_input():
    table = SlotTable(1, queue_size=2)
    new_lease(table)
    waiting = new_lease(table)
    pirate = Conversation(persona="You are a pirate.")
    assert waiting.restart(pirate) and waiting.conversation is pirate and waiting.state is LeaseState.QUEUED
    first = table.slots[0].lease
    table.started(table.slots[0], 0)
    first.flush()
    assert not first.restart(pirate)  # the input has ended: too late
