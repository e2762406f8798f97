"""The engine actor: lockstep ticks, slots, admission, failures, drain before release.

Most tests run the engine inline on a virtual clock (``autojump_clock``), with
engine compute time simulated by ``trio.sleep`` in the runner, so timings are
exact and deterministic.  The drain test uses a real worker thread.
"""

import contextlib
import math
import threading

import numpy as np
import pytest
import trio
import trio.testing

from _helpers.engine_calls import inline_runner, run_engine_calls
from pplex_trio.engine import (
    BEGUN_STATES,
    ActorSettings,
    ActorState,
    Conversation,
    EchoEngine,
    EngineActor,
    LeaseState,
    QueueFull,
    SlotMode,
)
from pplex_trio.engine._schedule import GRACE_PER_WINDOW

INPUT_GRACE = ActorSettings().input_grace_ms / 1000
EARLY_START = ActorSettings().early_start_ms / 1000
NO_EARLY_START = ActorSettings(early_start_ms=0)
# Stepped from the moment the prompt has run, not from the caller's first frame: for the tests of a grid
# that is running when a client starts streaming (as it is when other conversations are live).
STEP_AT_ONCE = ActorSettings(first_frame_timeout=0)
STEP_AT_ONCE_NO_EARLY_START = ActorSettings(first_frame_timeout=0, early_start_ms=0)

TICK = 0.080
FRAME = 1920


class RecordingEcho(EchoEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.steps = []  # (modes, copy of pcm)
        self.prefills = []  # (work asked, positions run)
        self.events = []  # ("start" | "reset", slot) and ("prefill", positions run), in order

    def step(self, modes, pcm):
        self.steps.append((list(modes), pcm.copy()))
        return super().step(modes, pcm)

    def prefill(self, work):
        done = super().prefill(work)
        self.prefills.append((dict(work), done))
        self.events.append(("prefill", done))
        return done

    def start(self, slot, conversation):
        self.events.append(("start", slot))
        return super().start(slot, conversation)

    def reset(self, slot):
        if hasattr(self, "events"):
            self.events.append(("reset", slot))
        super().reset(slot)


async def _record_waits(lease, waits):
    """Each output frame's wait for its tick: its input complete -> the tick starts."""
    async for batch in lease.frames():
        for frame in batch:
            if frame.input_arrival is not None:
                waits.append(frame.tick_started - frame.input_arrival)


async def next_frame(lease):
    """The next output frame (the tests read as fast as the engine writes: one per batch)."""
    (frame,) = await lease.frames().__anext__()
    return frame


async def sleep_until_before_tick(actor, lease, lead):
    """The handshake's wait, with the clients' reaction set so that its lead is ``lead``."""
    actor.schedule.reaction = lead - actor.schedule.steering.margin
    await lease.sleep_until_handshake()


def record_states(actor):
    """The actor's states from now on, each as it enters it."""
    states = []
    enter = actor._enter

    def recorded(state):
        enter(state)
        states.append(state)

    actor._enter = recorded
    return states


def moves(states):
    """The distinct moves among ``states`` (the actor's first state is IDLE)."""
    return {(a, b) for a, b in zip([ActorState.IDLE, *states], states)}


async def wait_state(lease, state):
    while lease.state is not state:
        await lease.wait_changed()


async def wait_begun(lease):
    """Until its prompt has run (READY: the caller may talk; its first frame makes it LIVE)."""
    while lease.state not in BEGUN_STATES:
        await lease.wait_changed()


async def test_prompt_at_once_then_live_in_lockstep(nursery, autojump_clock, monkeypatch):
    engine = RecordingEcho(2, prefill_steps=3, delay_frames=0)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine)
    await nursery.start(actor.run)
    frame = np.full(1920, 0.25, dtype=np.float32)
    with actor.lease(Conversation(persona="a")) as lease:
        assert lease.state is LeaseState.STARTING and lease.slot == 0
        t0 = trio.current_time()
        await wait_begun(lease)
        # Nobody else live: the start, then the whole prompt in one call at once, no tick before it is live.
        assert trio.current_time() == t0 and engine.steps == []
        assert engine.prefills == [({0: 3}, {0: 3})]
        lease.push_input(frame, trio.current_time())
        out = await next_frame(lease)
        np.testing.assert_array_equal(out.pcm, frame)
        assert out.text == " 0"
        assert lease.frames_consumed == 1
        # Without input, the live row is fed silence, one frame per tick.
        times = []
        for _ in range(3):
            out = await next_frame(lease)
            times.append(trio.current_time())
            assert not out.pcm.any()
        # 80 ms apart, less at most the steering's step (5 ms) towards where the one frame arrived;
        # never later: a row that stopped streaming is no late page (see _late_pages)
        assert all(TICK - 0.005 - 1e-9 <= d <= TICK + 1e-9 for d in np.diff(times))
    assert engine.started == [(0, Conversation(persona="a"))]
    # Rows other than the lease's were IDLE in every step.
    assert all(modes[1] is SlotMode.IDLE for modes, _ in engine.steps)


async def test_queue_positions_admission_and_full_queue(nursery, autojump_clock, monkeypatch):
    engine = EchoEngine(1, prefill_steps=1)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine, ActorSettings(queue_size=2))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as first:
        with actor.lease(Conversation()) as second, actor.lease(Conversation()) as third:
            assert (second.state, second.position) == (LeaseState.QUEUED, 1)
            assert (third.state, third.position) == (LeaseState.QUEUED, 2)
            with pytest.raises(QueueFull, match="queue is full"):
                with actor.lease(Conversation()):
                    pass
            assert actor.statistics().queued == 2
            # `first` leaves: its slot drains, then goes to `second`; `third` moves up.
            first.end()
            await wait_begun(second)
            assert third.position == 1 and second.slot == 0
        stats = actor.statistics()
    assert stats.queued == 0


async def test_leaving_the_queue_renumbers_the_others(nursery, autojump_clock, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(EchoEngine(1), ActorSettings(queue_size=3))
    await nursery.start(actor.run)
    with actor.lease(Conversation()):
        with actor.lease(Conversation()) as a:
            with actor.lease(Conversation()) as b:
                assert (a.position, b.position) == (1, 2)
                a.end()
                assert b.position == 1
                assert actor.statistics().queued == 1


async def test_overrun_starts_next_tick_at_once_and_far_behind_skips(nursery, autojump_clock, monkeypatch):
    log = []
    engine = EchoEngine(1, prefill_steps=0)
    compute = [0.030]

    async def runner(fn, *args):
        if args[1].tick is not None:  # the ticks (not the start before them)
            log.append(trio.current_time())
        await trio.sleep(compute[0])
        return fn(*args)

    run_engine_calls(monkeypatch, runner)
    actor = EngineActor(engine, STEP_AT_ONCE)
    await nursery.start(actor.run)
    with actor.lease(Conversation()):
        await trio.sleep(0.5)
        starts = list(log)
        assert np.diff(starts) == pytest.approx([TICK] * (len(starts) - 1))
        # A 100 ms step overruns the 80 ms budget by 20 ms: the next tick starts at once.
        log.clear()
        compute[0] = 0.100
        await trio.sleep(0.35)
        gaps = np.diff(log)
        assert gaps == pytest.approx([0.100] * len(gaps))
        assert actor.ticks_skipped == 0
        # A 250 ms step puts the actor more than a tick behind: it skips ahead, never bursts.
        log.clear()
        compute[0] = 0.250
        await trio.sleep(1.0)
        gaps = np.diff(log)
        assert min(gaps) >= 0.250 - 1e-9  # no catch-up burst
        assert actor.ticks_skipped >= 2 * len(gaps)  # each 250 ms step skips two 80 ms ticks
        assert actor.metrics.ticks_skipped._value.get() == actor.ticks_skipped


class ExplodingEcho(EchoEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.explode = False
        self.reset_all_calls = 0

    def step(self, modes, pcm):
        if self.explode:
            self.explode = False
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().step(modes, pcm)

    def reset_all(self):
        self.reset_all_calls += 1
        super().reset_all()


async def test_engine_exception_fails_its_conversations_and_the_engine_recovers(nursery, autojump_clock, monkeypatch):
    engine = ExplodingEcho(2, prefill_steps=0)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine)
    states = record_states(actor)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as a, actor.lease(Conversation()) as b:
        await wait_begun(a)
        engine.explode = True
        while a.failure is None:
            await a.wait_changed()
        assert a.failure.code == 1011 and b.failure.code == 1011
        assert "reconnect" in a.failure.message
        assert engine.reset_all_calls == 1
    assert actor.metrics.errors.labels("engine")._value.get() == 1
    A = ActorState
    assert moves(states) == {(A.IDLE, A.CALLING), (A.CALLING, A.IDLE), (A.CALLING, A.RESETTING), (A.RESETTING, A.IDLE)}
    assert not actor.stalled  # (a reset after a call that raised refuses nobody)
    with actor.lease(Conversation()) as c:
        await wait_begun(c)
        out = await next_frame(c)
        assert out.text == " 0"  # a fresh conversation on a reset engine
        assert c.failure is None


async def test_rejected_start_fails_only_that_conversation(nursery, autojump_clock, monkeypatch):
    from pplex_trio.engine import ConversationRejected

    class Picky(EchoEngine):
        def start(self, slot, conversation):
            if conversation.persona == "bad":
                raise ConversationRejected("persona 'bad' cannot be served: pick another")
            return super().start(slot, conversation)

    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(Picky(2, prefill_steps=0))
    await nursery.start(actor.run)
    with actor.lease(Conversation(persona="good")) as good, actor.lease(Conversation(persona="bad")) as bad:
        while bad.failure is None:
            await bad.wait_changed()
        assert bad.failure.code == 1008 and "pick another" in bad.failure.message
        await wait_begun(good)
        assert (await next_frame(good)).text == " 0"
        assert good.failure is None


class BlockingEcho(EchoEngine):
    """A step that blocks on an event the test controls (on the worker thread)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.block = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = []  # ("start"|"reset"|"step", slot or modes)

    def start(self, slot, conversation):
        self.calls.append(("start", slot))
        return super().start(slot, conversation)

    def reset(self, slot):
        self.calls.append(("reset", slot))
        super().reset(slot)

    def step(self, modes, pcm):
        self.calls.append(("step", list(modes)))
        if self.block:
            self.entered.set()
            assert self.release.wait(10), "test never released the engine"
        return super().step(modes, pcm)


async def test_drain_before_release(nursery):
    """A slot released mid-step is not handed on until that step has finished."""
    engine = BlockingEcho(1, prefill_steps=0)
    # Real worker thread, real clock; each row is stepped as soon as it is ready (no wait for a first frame).
    actor = EngineActor(engine, ActorSettings(queue_size=1, first_frame_timeout=0))
    await nursery.start(actor.run)
    with actor.lease(Conversation(persona="old")) as old:
        await wait_begun(old)
        engine.block = True
        await trio.to_thread.run_sync(engine.entered.wait)
        assert actor.state is ActorState.CALLING
        with actor.lease(Conversation(persona="new")) as new:
            assert new.state is LeaseState.QUEUED
            old.end()  # the old conversation leaves while its step runs
            for _ in range(5):
                await trio.sleep(0.05)
                assert actor.table.rows[0].state is LeaseState.DRAINING
                assert new.state is LeaseState.QUEUED  # not handed over while in flight
            calls_before = len(engine.calls)
            engine.block = False
            engine.release.set()
            await wait_begun(new)
            assert new.slot == 0
            # After the blocked step: reset of the old row, then the new start, then steps.
            assert engine.calls[calls_before : calls_before + 2] == [("reset", 0), ("start", 0)]
            out = await next_frame(new)
            assert out.text == " 0"  # fresh row: nothing of the old conversation leaks


async def test_idle_actor_does_not_tick(nursery, autojump_clock, monkeypatch):
    log = []
    run_engine_calls(monkeypatch, inline_runner(log=log))
    actor = EngineActor(EchoEngine(1, prefill_steps=0))
    await nursery.start(actor.run)
    await trio.sleep(1.0)
    assert log == [] and actor.ticks == 0
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        await trio.sleep(0.4)
    await trio.sleep(1.0)
    ticks = actor.ticks
    await trio.sleep(1.0)
    assert actor.ticks == ticks  # stopped after the slot drained
    assert actor.statistics().slots_free == 1


async def test_a_dropped_output_frame_keeps_its_text(nursery, autojump_clock, monkeypatch):
    """When a slow reader lets the outbox overflow, audio is dropped but text never is."""
    engine = EchoEngine(1, prefill_steps=0)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine, ActorSettings(first_frame_timeout=0, output_backlog_seconds=0.16))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        await trio.sleep(6 * TICK)  # nobody reads: 6 frames (from the first tick, a margin away) into a 2-frame outbox
        frames = await lease.frames().__anext__()  # everything that waited
        assert len(frames) == 2
    delivered = lease.frames_delivered
    assert delivered == 6 and lease.output_dropped == 4
    assert "".join(f.text for f in frames) == "".join(f" {i}" for i in range(delivered))


async def test_an_observer_sees_every_frame_with_what_the_model_heard_even_those_the_outbox_drops(
    nursery, autojump_clock, monkeypatch
):
    """``on_frame`` gets the conversation's timeline: each tick's input frame beside the model's output, before the
    outbox, so a reader that stalls loses frames that the observer still has."""
    engine = EchoEngine(1, prefill_steps=0, delay_frames=1)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine, ActorSettings(first_frame_timeout=0, output_backlog_seconds=0.16))
    await nursery.start(actor.run)
    seen = []
    said = [np.full(FRAME, (k + 1) / 16, np.float32) for k in range(4)]
    with actor.lease(
        Conversation(), on_frame=lambda f: seen.append((f.tick, f.heard.copy(), f.pcm.copy(), f.text))
    ) as lease:
        await wait_begun(lease)
        for pcm in said:
            lease.push_input(pcm, trio.current_time())
        await trio.sleep(6 * TICK)  # nobody reads: 6 frames into a 2-frame outbox
    assert lease.output_dropped == 4 and len(seen) == 6
    assert [tick for tick, *_ in seen] == list(range(seen[0][0], seen[0][0] + 6))
    heard = [h for _, h, _, _ in seen]
    assert all(np.array_equal(heard[k], said[k]) for k in range(4)) and not heard[4].any() and not heard[5].any()
    assert not seen[0][2].any() and all(np.array_equal(seen[k + 1][2], said[k]) for k in range(4))  # the echo
    assert [text for *_, text in seen] == [f" {k}" for k in range(6)]


async def test_an_observer_that_fails_is_let_go_and_the_conversation_goes_on(
    nursery, autojump_clock, monkeypatch, caplog
):
    engine = EchoEngine(1, prefill_steps=0)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine, STEP_AT_ONCE)
    await nursery.start(actor.run)
    calls = []

    def broken(frame):
        calls.append(frame.tick)
        raise ValueError("a bug in the observer")

    with actor.lease(Conversation(), on_frame=broken) as lease:
        await wait_begun(lease)
        frames = [await next_frame(lease) for _ in range(5)]
        assert lease.failure is None and lease.state is LeaseState.LIVE
    assert len(calls) == 1 and [f.text for f in frames] == [f" {k}" for k in range(5)]
    assert len([r for r in caplog.records if "observer of its frames failed" in r.getMessage()]) == 1


async def test_the_tick_grid_moves_to_just_after_the_audio_arrives(nursery, autojump_clock, monkeypatch):
    """A client whose frames land 30 ms after each tick: the grid drifts until they land just before.

    (Early start off, to watch the steering alone.)
    """
    engine = RecordingEcho(1, prefill_steps=0)
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(engine, STEP_AT_ONCE_NO_EARLY_START)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        first = trio.current_time()
        waits = []

        async def client():
            send_at = first + 0.030
            for _ in range(150):
                await trio.sleep_until(send_at)
                lease.push_input(np.full(1920, 0.5, np.float32), trio.current_time())
                send_at += TICK

        nursery.start_soon(_record_waits, lease, waits)
        await client()
    assert waits[0] > 0.035  # the naive grid: the audio waits ~40 ms for its tick
    assert max(waits[-20:]) < 0.010  # steered: ticks now come ~3 ms (the safety margin) after the audio
    assert actor.metrics.frames_silence._value.get() <= 2  # and no frame was missed on the way


async def test_a_client_that_starts_at_the_handshake_lands_just_ahead_of_the_ticks(
    nursery, autojump_clock, monkeypatch
):
    """Sending the handshake `lead` before a tick: the client's frames wait ~lead, from the first one (no early
    start)."""
    engine = RecordingEcho(1, prefill_steps=3)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine, STEP_AT_ONCE_NO_EARLY_START)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        await trio.sleep(0.023)  # the prefill's last tick was a while ago: an arbitrary phase
        await sleep_until_before_tick(actor, lease, 0.010)
        handshake = trio.current_time()
        waits = []
        nursery.start_soon(_record_waits, lease, waits)
        for k in range(1, 40):  # a whole frame of audio every 80 ms from the handshake on
            await trio.sleep_until(handshake + k * TICK)
            lease.push_input(np.full(1920, 0.5, np.float32), trio.current_time())
        await trio.sleep(TICK)
    assert waits[0] == pytest.approx(0.010, abs=1e-6)  # no settling needed
    assert all(
        actor.schedule.steering.margin - 1e-6 < w <= 0.010 + 1e-6 for w in waits
    )  # then steering trims it towards its margin
    assert len(waits) == 39 and lease.input_stats().underruns == 0  # every frame taken, none late


async def _steady_client(lease, first_at, frames, period=TICK):
    """A whole frame of audio at ``first_at`` and every ``period`` after it."""
    send_at = first_at
    for _ in range(frames):
        await trio.sleep_until(send_at)
        lease.push_input(np.full(1920, 0.5, np.float32), trio.current_time())
        send_at += period


async def test_a_tick_starts_as_soon_as_its_frame_is_in(nursery, autojump_clock, monkeypatch):
    """The same client as above, early start on: once steered within the window, no frame waits at all."""
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(1, prefill_steps=0), STEP_AT_ONCE)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        first = trio.current_time()
        ticks_before = actor.ticks
        waits = []
        nursery.start_soon(_record_waits, lease, waits)
        await _steady_client(lease, first + 0.030, 150)
        await trio.sleep(TICK)
        ticks = actor.ticks - ticks_before
    assert len(waits) == 150 and waits[0] > EARLY_START  # the naive grid first, as above (less the window)
    assert waits[-100:] == pytest.approx([0.0] * 100, abs=1e-9)  # then not even the steering's margin
    assert actor.metrics.frames_silence._value.get() <= 2
    assert ticks == pytest.approx((150 * TICK + 0.030 + TICK) / TICK, abs=1.5)  # one tick per period, not more


async def test_a_flooding_client_gets_no_more_ticks_than_the_period_allows(nursery, autojump_clock, monkeypatch):
    """Frames four times faster than real time: every tick starts early, none comes sooner than that."""
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(1, prefill_steps=0))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        nursery.start_soon(_record_waits, lease, [])
        await trio.sleep(0.001)
        ticks_before, started = actor.ticks, trio.current_time()
        await _steady_client(lease, started, 100, period=TICK / 4)  # 2 s of wall time
        ticks = actor.ticks - ticks_before
        elapsed = trio.current_time() - started
    assert ticks == pytest.approx(elapsed / TICK, abs=1.5)
    early = actor.metrics.tick_early
    assert _histogram(early, "_count") >= ticks - 2
    assert _histogram(early, "_sum") / _histogram(early, "_count") == pytest.approx(EARLY_START, abs=1e-6)


async def test_an_early_start_waits_for_every_streaming_conversation(nursery, autojump_clock, monkeypatch):
    """Two streaming clients 25 ms apart and one silent: once steered, ticks start when the later one's frame is in."""
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(3, prefill_steps=0), STEP_AT_ONCE)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as a, actor.lease(Conversation()) as b, actor.lease(Conversation()):
        await wait_begun(b)
        first = trio.current_time()
        waits_a, waits_b = [], []
        nursery.start_soon(_record_waits, a, waits_a)
        nursery.start_soon(_record_waits, b, waits_b)
        async with trio.open_nursery() as clients:
            clients.start_soon(_steady_client, a, first + 0.020, 60)
            clients.start_soon(_steady_client, b, first + 0.045, 60)
        await trio.sleep(TICK)
    # Steered to just after b's audio (a's comes 25 ms before it), the ticks start the moment b's frame is in.
    assert waits_b[-30:] == pytest.approx([0.0] * 30, abs=1e-9)
    assert waits_a[-30:] == pytest.approx([0.025] * 30, abs=1e-9)
    assert a.input_stats().underruns == b.input_stats().underruns == 0


async def test_the_grid_starts_afresh_after_idling(nursery, autojump_clock, monkeypatch):
    """A second conversation, after the first left the actor idle, is not steered by the first one's timing."""
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(1, prefill_steps=0), STEP_AT_ONCE_NO_EARLY_START)
    await nursery.start(actor.run)
    all_waits = []
    for phase in (0.075, 0.030):  # the first conversation pulls the grid 70 ms earlier; the second needs none of it
        with actor.lease(Conversation()) as lease:
            await wait_begun(lease)
            waits = []
            nursery.start_soon(_record_waits, lease, waits)
            await _steady_client(lease, trio.current_time() + phase, 150)
            await trio.sleep(TICK)
        all_waits.append(waits)
        await trio.sleep(1.0)  # idle
    second = all_waits[1]
    # Fresh steering: 40 ms at first, then 5 ms closer per tick at most, from the second frame on (the
    # first conversation's slacks, kept, would hold the grid still for a whole window of 25 ticks).
    assert second[0] > 0.035 and second[1] < second[0] - 0.004 and max(second[10:]) < 0.010


async def test_the_handshake_goes_at_once_while_idle(autojump_clock, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(EchoEngine(1))
    with actor.lease(Conversation()) as lease:  # (the actor is not running: nobody is live)
        before = trio.current_time()
        await lease.sleep_until_handshake()
        assert trio.current_time() == before


def _histogram(histogram, suffix):
    return next(s.value for s in histogram.collect()[0].samples if s.name.endswith(suffix))


async def _stream_pages(actor, lease, handshake, pages, delay):
    """Pages of 40 ms from the handshake on, page k at handshake + 40 ms * k + delay(k)."""
    for k in range(1, pages + 1):
        await trio.sleep_until(handshake + k * TICK / 2 + delay(k))
        lease.push_input(np.full(960, 0.5, np.float32), trio.current_time())


async def _aligned_client(actor, nursery, pages, delay):
    with actor.lease(Conversation(), align=True) as lease:
        await wait_begun(lease)
        await sleep_until_before_tick(actor, lease, actor.schedule.steering.margin)
        waits = []
        nursery.start_soon(_record_waits, lease, waits)
        await _stream_pages(actor, lease, trio.current_time(), pages, delay)
        await trio.sleep(TICK)
        return lease, waits


@pytest.mark.parametrize("grace", [0.0, 0.004])
async def test_a_page_a_little_late_holds_the_tick_instead_of_missing_it(nursery, autojump_clock, grace, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(1, prefill_steps=2), ActorSettings(input_grace_ms=grace * 1000, early_start_ms=0))
    await nursery.start(actor.run)
    # Page 20 completes frame 10 and comes 5 ms late: 2 ms after its tick.
    lease, waits = await _aligned_client(actor, nursery, 40, lambda k: 0.005 if k == 20 else 0.0)
    count = _histogram(actor.metrics.tick_input_wait, "_count")
    if grace:
        assert count == 1  # that one tick waited for it ...
        assert lease.input_stats().underruns == 0  # ... so no tick came before its frame
        assert max(waits) < 0.010  # and no frame carries a tick of delay
    else:
        assert count == 0
        assert lease.input_stats().underruns == 1  # the model heard a silent frame
        assert max(waits) > 0.070  # and the late frame waited a whole tick


async def test_a_page_later_than_the_grace_is_not_waited_for_past_it(nursery, autojump_clock, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(1, prefill_steps=2))
    await nursery.start(actor.run)
    lease, _ = await _aligned_client(actor, nursery, 40, lambda k: 0.020 if k == 20 else 0.0)
    assert lease.input_stats().underruns == 1  # 17 ms after its tick: late, as without the grace
    assert _histogram(actor.metrics.tick_input_wait, "_count") == 1  # one hold ...
    assert _histogram(actor.metrics.tick_input_wait, "_sum") == pytest.approx(INPUT_GRACE)  # ... of just the grace


async def test_holds_are_rationed(nursery, autojump_clock, monkeypatch):
    """A client late by 2 ms on every frame gets a few holds per window, not a slower clock for everyone."""
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(1, prefill_steps=2))
    await nursery.start(actor.run)
    ticks_before = actor.ticks
    grace_window = round(2.0 / TICK)  # ticks in 2 s
    lease, _ = await _aligned_client(
        actor, nursery, 2 * grace_window * 2, lambda k: 0.005 if k % 2 == 0 and k >= 4 else 0.0
    )
    count = _histogram(actor.metrics.tick_input_wait, "_count")
    windows = (actor.ticks - ticks_before) / grace_window
    assert 1 <= count <= GRACE_PER_WINDOW * (windows + 1)


async def test_flush_ends_the_output_once_every_input_frame_is_answered(nursery, autojump_clock, monkeypatch):
    """OutputEnd follows the answer to the last input frame, even in a full outbox; nothing follows it."""
    from pplex_trio.engine import OutputEnd, OutputFrame

    engine = EchoEngine(1, prefill_steps=0, delay_frames=0)
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(engine, ActorSettings(output_backlog_seconds=0.16))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        for k in range(3):
            assert lease.push_input(np.full(1920, k + 1, np.float32), trio.current_time())
        lease.flush()
        assert not lease.push_input(np.zeros(1920, np.float32), trio.current_time())  # no input after a flush
        await trio.sleep(1.0)  # nobody reads while the ticks go on
        batch = await lease.frames().__anext__()
    assert [type(event) for event in batch] == [OutputFrame, OutputFrame, OutputEnd]
    assert [frame.pcm[0] for frame in batch[:2]] == [2.0, 3.0]  # the oldest frame's audio was dropped ...
    assert batch[0].text == " 0 1" and batch[1].text == " 2"  # ... its text was not
    assert lease.frames_delivered == 3  # the ticks after the end delivered nothing


async def test_input_before_live_is_refused(nursery, autojump_clock, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(EchoEngine(1, prefill_steps=3))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        assert lease.state is LeaseState.STARTING
        assert not lease.push_input(np.ones(1920, np.float32), trio.current_time())
        await wait_begun(lease)
        assert lease.input_stats().pending == 0
    assert lease.state is LeaseState.DRAINING  # given back; its slot is freed at the next engine call
    lease.end()  # ending twice is harmless
    await wait_state(lease, LeaseState.ENDED)
    assert actor.statistics().slots_free == 1


async def test_a_step_past_the_engine_timeout_stalls_the_actor_until_it_returns(nursery, autojump_clock, monkeypatch):
    """The watchdog ends the step's conversations at the timeout, waits for the call, then resets the engine."""
    engine = ExplodingEcho(1, prefill_steps=0)
    hang = {"calls": 0}

    async def runner(fn, *args):
        hang["calls"] += 1
        if hang["calls"] == 5:
            await trio.sleep(30.0)  # a GPU call that takes 30 s to come back
        return fn(*args)

    run_engine_calls(monkeypatch, runner)
    actor = EngineActor(engine, ActorSettings(engine_timeout=10.0))
    states = record_states(actor)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        while lease.failure is None:
            await lease.wait_changed()
        stalled_at = trio.current_time()
        assert lease.failure.code == 1011 and "stalled" in lease.failure.message
        assert actor.stalled and actor.metrics.engine_stalled._value.get() == 1
        assert actor.state is ActorState.STALLED and actor.statistics().state is ActorState.STALLED
    while actor.stalled:
        await trio.sleep(0.1)
    A = ActorState
    assert moves(states) == {
        (A.IDLE, A.CALLING),
        (A.CALLING, A.IDLE),
        (A.CALLING, A.STALLED),
        (A.STALLED, A.RECOVERING),
        (A.RECOVERING, A.IDLE),
    }
    assert trio.current_time() - stalled_at == pytest.approx(20.0, abs=0.2)  # it waited for the call
    assert engine.reset_all_calls == 1 and actor.metrics.engine_stalled._value.get() == 0
    with actor.lease(Conversation()) as fresh:
        await wait_begun(fresh)
        assert (await next_frame(fresh)).text == " 0"


async def test_a_client_that_stops_sending_is_no_late_page(nursery, autojump_clock, monkeypatch):
    """Conversations one after another, each ending with a pause before it closes: the margin stays put.

    (Counted as late pages, each end widened the margin by 2 ms, and with it the handshake's lead.)
    """
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(1, prefill_steps=0))
    await nursery.start(actor.run)
    margins = []
    for _ in range(3):
        with actor.lease(Conversation()) as lease:
            await wait_begun(lease)
            nursery.start_soon(_record_waits, lease, [])
            await _steady_client(lease, trio.current_time() + 0.030, 40)
            await trio.sleep(5 * TICK)  # no more audio, still connected (a client draining before it closes)
        margins.append(actor.schedule.steering.margin)
        await trio.sleep(1.0)
    assert actor.metrics.frames_silence._value.get() >= 3 * 4  # the ticks after each end had no frame
    assert margins == [actor.schedule.steering.min_margin] * 3


async def test_a_page_that_comes_after_its_tick_widens_the_margin(nursery, autojump_clock, monkeypatch):
    """A frame 40 ms late, then on time again: that was jitter, and the steering learns from it a tick later."""
    run_engine_calls(monkeypatch, inline_runner(compute_seconds=0.010))
    actor = EngineActor(RecordingEcho(1, prefill_steps=0), NO_EARLY_START)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        nursery.start_soon(_record_waits, lease, [])
        first = trio.current_time() + 0.030
        await _steady_client(lease, first, 60)
        assert actor.schedule.steering.margin == actor.schedule.steering.min_margin
        await trio.sleep_until(first + 60 * TICK + 0.040)  # frame 61, 40 ms late
        lease.push_input(np.full(1920, 0.5, np.float32), trio.current_time())
        await _steady_client(lease, first + 61 * TICK, 5)
    assert actor.schedule.steering.margin == pytest.approx(actor.schedule.steering.min_margin + 0.002)


def costed_runner(step=0.020, fixed=0.003, per_position=0.0004, per_voice_frame=0.002, log=None):
    """Engine calls that take virtual time like a GPU: ``step`` per tick, ``fixed + per_position * n`` per prompt
    call, ``fixed + per_voice_frame * n`` per call that makes frames of a voice."""
    from pplex_trio.engine._engine_call import execute

    async def run(fn, *args):
        cost = 0.0
        if fn is execute:
            call = args[1]
            cost += step if call.tick is not None else 0.0
            positions = sum(call.prefill.values())
            cost += fixed + per_position * positions if positions else 0.0
            frames = call.job[1] if call.job is not None else 0
            cost += fixed + per_voice_frame * frames if frames else 0.0
            kind = "tick" if call.tick is not None else "voice" if frames else "prompt"
            if log is not None:
                log.append((trio.current_time(), kind, positions or frames, cost))
        await trio.sleep(cost)
        return fn(*args)

    return run


async def test_prompts_run_between_ticks_and_never_make_a_tick_late(nursery, autojump_clock, monkeypatch):
    """One conversation talks; another joins with a 400-position prompt: it runs in the gaps, sized to them."""
    log = []
    engine = RecordingEcho(2, prefill_steps=400)
    run_engine_calls(monkeypatch, costed_runner(log=log))
    actor = EngineActor(engine)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as talker:
        await wait_begun(talker)
        nursery.start_soon(_record_waits, talker, [])
        nursery.start_soon(_steady_client, talker, trio.current_time() + 0.030, 60)
        await trio.sleep(1.0)
        lateness = actor.metrics.tick_lateness
        before = _histogram(lateness, "_count"), _histogram(lateness, "_sum")
        joined = trio.current_time()
        with actor.lease(Conversation()) as joiner:
            await wait_begun(joiner)
            ready = trio.current_time() - joined
            await trio.sleep(0.5)
        count = _histogram(lateness, "_count") - before[0]
        late = _histogram(lateness, "_sum") - before[1]
    prompts = [entry for entry in log if entry[1] == "prompt" and entry[0] > joined]
    assert sum(n for _, _, n, _ in prompts) == 400 and len(prompts) >= 2  # in pieces, not all at once
    assert late == 0 and count >= 8  # not one tick started late for them
    # Each prompt call ended before the next tick could start (its deadline less the early start window).
    ticks = [t for t, kind, _, _ in log if kind == "tick"]
    for start, _, _, cost in prompts:
        next_tick = min(t for t in ticks if t > start)
        assert start + cost <= next_tick + 1e-9
    # 400 positions at 0.4 ms, ~50 ms of room per 80 ms: ready within a few ticks, not 400 of them.
    assert ready < 8 * TICK
    assert actor.metrics.time_to_live._sum.get() > 0


async def test_a_prompt_alone_runs_back_to_back(nursery, autojump_clock, monkeypatch):
    log = []
    engine = RecordingEcho(1, prefill_steps=1000)
    run_engine_calls(monkeypatch, costed_runner(per_position=0.001, log=log))
    actor = EngineActor(engine)
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        ready = trio.current_time()
    # Nobody live: calls of about a tick each (the first one measures the cost), one after the other.
    assert ready == pytest.approx(sum(cost for *_, cost in log), abs=1e-9)
    assert ready < 1000 * 0.001 * 1.2 + 0.1
    assert all(kind == "prompt" for _, kind, _, _ in log)


async def test_a_client_leaving_mid_prompt_frees_its_slot_and_leaks_nothing(nursery, autojump_clock, monkeypatch):
    engine = RecordingEcho(1, prefill_steps=600)
    run_engine_calls(monkeypatch, costed_runner(per_position=0.001))
    actor = EngineActor(engine, ActorSettings(queue_size=1))
    await nursery.start(actor.run)
    with actor.lease(Conversation(persona="first")) as first:
        await trio.sleep(0.2)  # a third of its prompt
        assert first.state is LeaseState.PREFILL and 0 < engine._prompt_left[0] < 600
        with actor.lease(Conversation(persona="second")) as second:
            assert second.state is LeaseState.QUEUED
            first.end()
            await wait_begun(second)
            assert second.slot == 0 and actor.table.rows[0].prompt_total == 600  # (the engine end's to read)
    # The second prompt ran whole, on a reset row: nothing of the first one's progress carried over.
    assert [conversation.persona for _, conversation in engine.started] == ["first", "second"]
    second_start = [i for i, event in enumerate(engine.events) if event == ("start", 0)][1]
    assert ("reset", 0) in engine.events[:second_start]
    assert sum(event[1][0] for event in engine.events[second_start:] if event[0] == "prefill") == 600
    await trio.sleep(0.5)
    assert actor.statistics().slots_free == 1 and actor.table.prompts_left() == {}


async def test_a_flood_of_joins_queues_and_never_starves_the_live_rows(nursery, autojump_clock, monkeypatch):
    engine = RecordingEcho(4, prefill_steps=300)
    run_engine_calls(monkeypatch, costed_runner(per_position=0.0005))
    actor = EngineActor(engine, ActorSettings(queue_size=20))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as talker:
        await wait_begun(talker)
        waits = []
        nursery.start_soon(_record_waits, talker, waits)
        nursery.start_soon(_steady_client, talker, trio.current_time() + 0.030, 80)
        await trio.sleep(1.0)
        lateness = actor.metrics.tick_lateness
        late_before = _histogram(lateness, "_sum")
        with contextlib.ExitStack() as stack:
            joiners = [stack.enter_context(actor.lease(Conversation())) for _ in range(12)]
            assert [j.state for j in joiners[:3]] == [LeaseState.STARTING] * 3
            assert [j.position for j in joiners[3:]] == list(range(1, 10))  # the queue, in order
            await wait_begun(joiners[0])
            for j in joiners[:3]:
                j.end()  # three talk briefly and leave: the queue moves up
            await wait_begun(joiners[3])
            assert joiners[11].position == 6
        assert _histogram(lateness, "_sum") == late_before  # the talker's ticks were never late
    assert talker.input_stats().underruns <= 1


# --- voices made from recordings, between ticks ---------------------------------------------------


def _clip(seconds: float) -> np.ndarray:
    return np.full(int(seconds * 24_000), 0.1, dtype=np.float32)


async def test_voices_are_made_between_ticks_and_never_make_a_tick_late(nursery, autojump_clock, monkeypatch):
    """Ten 4 s voices asked at once beside a live conversation: made one after another in the gaps."""
    log = []
    run_engine_calls(monkeypatch, costed_runner(log=log))
    actor = EngineActor(RecordingEcho(2))
    await nursery.start(actor.run)
    made = []

    async def add_voice(i):
        made.append((i, await actor.run_job(actor.engine.make_voice(_clip(4.0)))))

    with actor.lease(Conversation()) as talker:
        await wait_begun(talker)
        nursery.start_soon(_record_waits, talker, [])
        nursery.start_soon(_steady_client, talker, trio.current_time() + 0.030, 200)
        await trio.sleep(1.0)
        lateness = actor.metrics.tick_lateness
        before = _histogram(lateness, "_count"), _histogram(lateness, "_sum")
        asked = trio.current_time()
        async with trio.open_nursery() as uploads:
            for i in range(10):
                uploads.start_soon(add_voice, i)
        took = trio.current_time() - asked
        count = _histogram(lateness, "_count") - before[0]
        assert _histogram(lateness, "_sum") == before[1] and count > 20  # not one tick late
    assert sorted(i for i, _ in made) == list(range(10))
    assert all(data == b"echo test engine voice: 50 frames\n" for _, data in made)
    voices = [entry for entry in log if entry[1] == "voice"]
    assert sum(n for _, _, n, _ in voices) == 500
    ticks = [t for t, kind, _, _ in log if kind == "tick"]
    for start, _, _, cost in voices:  # each call ended before the next tick could start
        next_tick = min((t for t in ticks if t > start), default=math.inf)
        assert start + cost <= next_tick + 1e-9
    # 500 frames at 2 ms in the ~50 ms a tick leaves: a few seconds, not a frame per tick (40 s).
    assert took < 6.0 and actor.jobs_waiting == 0


async def test_a_voice_waits_for_a_joining_conversations_prompt(nursery, autojump_clock, monkeypatch):
    log = []
    run_engine_calls(monkeypatch, costed_runner(log=log))
    actor = EngineActor(RecordingEcho(2, prefill_steps=400))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as talker:
        await wait_begun(talker)
        nursery.start_soon(_steady_client, talker, trio.current_time() + 0.030, 100)
        await trio.sleep(0.5)
        nursery.start_soon(actor.run_job, actor.engine.make_voice(_clip(20.0)))
        await trio.sleep(0.3)  # the voice is being made
        assert 0 < actor.jobs_waiting
        with actor.lease(Conversation()) as joiner:
            joined = trio.current_time()
            await wait_begun(joiner)
            live = trio.current_time()
    between = [kind for t, kind, _, _ in log if joined <= t < live and kind != "tick"]
    assert between and set(between) == {"prompt"}  # no voice frame ran until the prompt was done
    assert "voice" in [kind for t, kind, _, _ in log if t >= live]  # then the voice went on


async def test_a_voice_that_fails_is_its_callers_error_alone(nursery, autojump_clock, monkeypatch):
    class BadVoiceEcho(RecordingEcho):
        def make_voice(self, pcm):
            job = super().make_voice(pcm)
            if len(pcm) < 24_000:

                def advance(frames):
                    raise ValueError("this clip is no voice")

                job.advance = advance
            return job

    run_engine_calls(monkeypatch, costed_runner())
    actor = EngineActor(BadVoiceEcho(1))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as talker:
        await wait_begun(talker)
        nursery.start_soon(_steady_client, talker, trio.current_time() + 0.030, 50)
        with pytest.raises(ValueError, match="no voice"):
            await actor.run_job(actor.engine.make_voice(_clip(0.5)))
        assert await actor.run_job(actor.engine.make_voice(_clip(2.0))) == b"echo test engine voice: 25 frames\n"
        assert talker.state is LeaseState.LIVE
    assert actor.metrics.errors.labels("engine")._value.get() == 0


async def test_a_caller_that_goes_away_leaves_nothing_behind(nursery, autojump_clock, monkeypatch):
    log = []
    run_engine_calls(monkeypatch, costed_runner(log=log))
    actor = EngineActor(RecordingEcho(1))
    await nursery.start(actor.run)
    with trio.move_on_after(0.1):
        await actor.run_job(actor.engine.make_voice(_clip(30.0)))  # 375 frames: ~0.8 s alone
    assert actor.jobs_waiting == 0
    frames = sum(n for _, kind, n, _ in log if kind == "voice")
    await trio.sleep(2.0)
    assert 0 < frames < 375 and sum(n for _, kind, n, _ in log if kind == "voice") == frames


async def test_an_engine_without_voices_says_so(nursery, autojump_clock, monkeypatch):
    from pplex_trio.engine import Engine

    class NoVoices(RecordingEcho):
        make_voice = Engine.make_voice

    run_engine_calls(monkeypatch, costed_runner())
    actor = EngineActor(NoVoices(1))
    await nursery.start(actor.run)
    with pytest.raises(NotImplementedError, match="cannot make voices"):
        await actor.run_job(actor.engine.make_voice(_clip(1.0)))


async def test_an_idle_actor_hands_a_held_slot_on_when_its_hold_lapses(nursery, autojump_clock, monkeypatch):
    """Nobody live, one slot held for a client that left, another waiting: the actor sleeps until the hold
    lapses (no spinning: under the virtual clock a spin would stop time), then the waiting one gets it."""
    from pplex_trio.engine._slots import RETURN_WINDOW

    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(EchoEngine(1, prefill_steps=0), ActorSettings(queue_size=1))
    await nursery.start(actor.run)
    with actor.lease(Conversation(), client="10.0.0.1") as first:
        await wait_begun(first)
        with actor.lease(Conversation(), client="10.0.0.2") as waiting:
            assert waiting.state is LeaseState.QUEUED
            first.end(client_left=True)
            left = trio.current_time()
            await wait_state(first, LeaseState.HELD)
            assert actor.statistics().slots == {"free": 0, "prefill": 0, "live": 0, "draining": 0, "held": 1}
            await wait_begun(waiting)
            assert trio.current_time() - left == pytest.approx(RETURN_WINDOW, abs=TICK)
            assert first.state is LeaseState.ENDED and waiting.slot == 0
