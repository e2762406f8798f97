"""One timebase: at another tick period every window keeps its length in seconds.

The echo engine runs on the virtual clock at 40 ms and 100 ms ticks (and 80 ms, the default).  Each
window's expected length is written here in seconds, as the settings' help describes it, and turned into
ticks by this test's own arithmetic: none of it is read from the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import trio

from _helpers.engine_calls import inline_runner, run_engine_calls
from pplex_trio.engine import BEGUN_STATES, ActorSettings, Conversation, EchoEngine, EngineActor

PERIODS = [0.040, 0.080, 0.100]
FRAME = 1920

# The windows, in seconds.
GRACE_WINDOW = 2.0  # at most 3 held ticks in any 2 s
GRACE_HOLDS = 3
STEERING_WINDOW = 10.0  # after a late page, the grid moves earlier only once 10 s have been seen again
STEERING_CALM = 6.0  # 6 s without a late page narrows the margin
FRAMER_WINDOW = 2.0  # aligned framing skips what every tick of 2 s had to spare
FRAMER_HOLD = 4.0  # and nothing for 4 s after an underrun
WORK_STARVED = 2.0  # work that found no room for 2 s gets a call anyway
BACKLOG = 4.0  # the input and output backlogs


def ticks(seconds: float, period: float) -> int:
    return round(seconds / period)


async def wait_begun(lease):
    while lease.state not in BEGUN_STATES:
        await lease.wait_changed()


@pytest.mark.parametrize("period", PERIODS)
async def test_every_window_is_its_seconds_in_ticks(period, autojump_clock):
    actor = EngineActor(EchoEngine(1, prefill_steps=0), ActorSettings(tick_seconds=period))
    schedule = actor.schedule
    assert schedule.grace_window == ticks(GRACE_WINDOW, period)
    assert schedule.steering.window == ticks(STEERING_WINDOW, period)
    assert schedule.steering.calm_ticks == ticks(STEERING_CALM, period)
    assert actor.work.starved_ticks == ticks(WORK_STARVED, period)
    with actor.lease(Conversation(), align=True) as lease:
        framer = lease._core.framer
        assert framer.window == ticks(FRAMER_WINDOW, period)
        assert framer.hold_after_underrun == ticks(FRAMER_HOLD, period)
        assert framer.max_frames == ticks(BACKLOG, period)  # (one frame a tick)
        assert lease._core.outbox.capacity == ticks(BACKLOG, period)


@pytest.mark.parametrize("period", PERIODS)
async def test_ticks_come_every_period(period, nursery, autojump_clock, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(EchoEngine(1, prefill_steps=0), ActorSettings(tick_seconds=period, first_frame_timeout=0))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as lease:
        await wait_begun(lease)
        times = []
        for _ in range(6):
            await lease.frames().__anext__()
            times.append(trio.current_time())
    assert np.diff(times) == pytest.approx([period] * 5, abs=0.005 + 1e-9)  # (the steering's step at most)


@pytest.mark.parametrize("period", PERIODS)
def test_the_grace_is_rationed_per_two_seconds(period):
    """A page due at every tick: at most 3 holds in any 2 s, and 3 in some (each tick asks, as
    ``wait_for_tick`` does, and a tick allowed the grace is held)."""
    actor = EngineActor(EchoEngine(1), ActorSettings(tick_seconds=period))
    schedule = actor.schedule
    holds = []
    for tick in range(ticks(10.0, period)):
        schedule.ticks = tick
        if schedule._grace_allowed(now=tick * period, deadline=tick * period):
            schedule._held.append(tick)
            holds.append(tick * period)
    assert len(holds) > GRACE_HOLDS
    spans = [later - first for first, later in zip(holds, holds[GRACE_HOLDS:])]
    assert min(spans) == pytest.approx(GRACE_WINDOW)  # a 4th hold once the first of three is 2 s behind


@pytest.mark.parametrize("period", PERIODS)
def test_the_steering_relearns_for_ten_seconds_and_calms_after_six(period):
    actor = EngineActor(EchoEngine(1), ActorSettings(tick_seconds=period))
    steering = actor.schedule.steering
    steering.adjust([0.050], late=1)  # a late page: margin wider, the window forgotten
    widened = steering.margin
    calm = 0
    while steering.adjust([0.030 + steering.moved], late=0) == 0.0:
        calm += 1
        assert calm < 1000
    assert (calm + 1) * period == pytest.approx(STEERING_WINDOW)  # moves earlier once a window is whole again
    steering.adjust([0.050], late=1)
    widened = steering.margin
    for tick in range(1, ticks(STEERING_CALM, period) + 1):
        steering.adjust([], late=0)
        assert (steering.margin < widened) == (tick * period >= STEERING_CALM - 1e-9), tick


@pytest.mark.parametrize("period", PERIODS)
async def test_the_framer_skips_after_two_seconds_and_holds_four_after_an_underrun(period, autojump_clock):
    actor = EngineActor(EchoEngine(1), ActorSettings(tick_seconds=period))
    with actor.lease(Conversation(), align=True) as lease:
        framer = lease._core.framer
    out = np.empty(FRAME, np.float32)
    surplus = FRAME // 4  # 20 ms that every tick has to spare

    def tick_with(samples):
        framer.push(np.full(samples, 0.5, np.float32))
        return framer.pop_frame_into(out)

    framer.push(np.full(surplus, 0.5, np.float32))
    pops = 0
    while framer.skipped_samples == 0:
        tick_with(FRAME)
        pops += 1
        assert pops < 1000
    assert pops * period == pytest.approx(FRAMER_WINDOW)
    framer.pop_frame_into(out)  # nothing waits: an underrun (it keeps a margin of ``surplus`` from now on)
    framer.push(np.full(2 * surplus, 0.5, np.float32))
    skipped, pops = framer.skipped_samples, 0
    while framer.skipped_samples == skipped:
        tick_with(FRAME)
        pops += 1
        assert pops < 1000
    assert pops * period == pytest.approx(FRAMER_HOLD + FRAMER_WINDOW)  # the hold, then a whole window
