"""A lease's lifecycle: one enum, its moves in one table, and what each state refuses."""

from __future__ import annotations

import numpy as np
import pytest

from pplex_trio._conversation import CloseCode, Conversation
from pplex_trio.engine import LeaseFailed, LeaseState, OutputEnd, OutputFrame, SlotPhase
from pplex_trio.engine._framing import InputFramer
from pplex_trio.engine._lease import _LEASE_NEXT, Lease
from pplex_trio.engine._slots import SlotTable

FRAME = 1920


def new_lease(table: SlotTable, *, early_audio: bool = False) -> Lease:
    lease = Lease(Conversation(), framer=InputFramer(FRAME, 4), output_capacity=8, on_drop=lambda name, n: None,
                  on_input=lambda lease: None, on_end=table.release, early_audio=early_audio)
    table.request(lease)
    return lease


def output(tick: int) -> OutputFrame:
    return OutputFrame(pcm=np.zeros(FRAME, np.float32), text=None, tick=tick)


def test_the_moves_a_lease_may_make():
    S = LeaseState
    assert _LEASE_NEXT[S.QUEUED] == {S.QUEUED, S.PREFILL, S.FAILED}
    assert _LEASE_NEXT[S.PREFILL] == {S.LIVE, S.FLUSHING, S.FAILED}
    assert _LEASE_NEXT[S.LIVE] == {S.FLUSHING, S.FAILED}
    assert _LEASE_NEXT[S.FLUSHING] == {S.FLUSHED, S.FAILED}
    assert _LEASE_NEXT[S.FAILED] == set() and _LEASE_NEXT[S.ENDED] == set()


def test_a_move_the_lifecycle_does_not_have_is_refused():
    table = SlotTable(1, queue_size=1)
    lease = new_lease(table)
    table.started(table.slots[0], 0)
    assert lease.state is LeaseState.LIVE
    with pytest.raises(RuntimeError, match="no transition from live to prefill"):
        lease._set(LeaseState.PREFILL)
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
