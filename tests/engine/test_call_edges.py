"""The edges of a call, in the engine: the first step waits for the caller's first frame, and a network stall
(either way) costs neither words nor lasting latency.

The echo engine with no delay hands back, at each tick, the frame it took at
that tick, so what the model heard is what comes out.  Real speech
(``speech_service.wav``) is streamed at real time on the virtual clock, in
pages of 40 ms as the official client sends them.
"""

from __future__ import annotations

import numpy as np
import pytest
import sphn
import trio

from _helpers.engine_calls import inline_runner, run_engine_calls
from pplex_trio.codec import is_silent
from pplex_trio.engine import BEGUN_STATES, ActorSettings, Conversation, EchoEngine, EngineActor, LeaseState

TICK = 0.080
FRAME = 1920
PAGE = 960


class CountingEcho(EchoEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.live_steps = 0

    def step(self, modes, pcm):
        self.live_steps += 1
        return super().step(modes, pcm)


async def begun(lease):
    while lease.state not in BEGUN_STATES:
        await lease.wait_changed()


async def collect(lease, out, held=lambda: False):
    """Read the lease's output like a send task (nothing while ``held()``: a reader that is stuck)."""
    async for batch in lease.frames():
        while held():
            await trio.sleep(0.01)
        out.extend((trio.current_time(), frame) for frame in batch if hasattr(frame, "pcm"))


@pytest.fixture(scope="module")
def speech(shared_dir) -> np.ndarray:
    pcm, _ = sphn.read(str(shared_dir / "data" / "speech_service.wav"), sample_rate=24_000)
    return pcm[0][: (pcm.shape[1] // FRAME) * FRAME].astype(np.float32)


# -- the first step -----------------------------------------------------------------------------------------


async def test_the_first_step_consumes_the_callers_first_frame(nursery, autojump_clock, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner())
    engine = CountingEcho(1, prefill_steps=3, delay_frames=0)
    actor = EngineActor(engine)
    await nursery.start(actor.run)
    out = []
    with actor.lease(Conversation()) as lease:
        await begun(lease)
        assert lease.state is LeaseState.READY
        nursery.start_soon(collect, lease, out)
        await trio.sleep(1.5)  # a client that starts its microphone late (the official one: ~0.7 s)
        assert engine.live_steps == 0 and out == [] and actor.ticks == 0  # no step, no audio out
        first = np.full(FRAME, 0.25, np.float32)
        sent_at = trio.current_time()
        lease.push_input(first[:PAGE], sent_at)
        lease.push_input(first[PAGE:], sent_at)
        await trio.sleep(TICK / 2)
        assert lease.state is LeaseState.LIVE and engine.live_steps == 1
        ((at, frame),) = out
        np.testing.assert_array_equal(frame.pcm, first)  # the model's first step heard the caller's first frame
        assert at - sent_at == pytest.approx(actor.schedule.steering.margin)  # at once, with no grid running
        await trio.sleep(1.0)
        assert len(out) == 1 + 12  # then one frame a tick, silence where the caller sends none


async def test_a_listening_client_is_stepped_once_its_first_frame_is_overdue(nursery, autojump_clock, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(CountingEcho(1, prefill_steps=0), ActorSettings(first_frame_timeout=2.0))
    await nursery.start(actor.run)
    out = []
    with actor.lease(Conversation()) as lease:
        await begun(lease)
        ready = trio.current_time()
        nursery.start_soon(collect, lease, out)
        while not out:
            await trio.sleep(0.001)
        assert lease.state is LeaseState.LIVE
        assert out[0][0] - ready == pytest.approx(2.0 + actor.schedule.steering.margin)


async def test_a_first_frame_beside_live_conversations_waits_for_their_next_tick(nursery, autojump_clock, monkeypatch):
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(CountingEcho(2, prefill_steps=0, delay_frames=0), ActorSettings(first_frame_timeout=0))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as talking:
        await begun(talking)
        await trio.sleep(1.0)  # stepped with silence: a grid runs
        with actor.lease(Conversation(), client=None) as joining:
            actor.schedule.first_frame_timeout = 10.0  # (this one waits for its caller)
            await begun(joining)
            await trio.sleep(0.5)
            assert joining.state is LeaseState.READY
            out = []
            nursery.start_soon(collect, joining, out)
            joining.push_input(np.full(FRAME, 0.5, np.float32), trio.current_time())
            while not out:
                await trio.sleep(0.001)
            assert out[0][1].pcm[0] == 0.5 and out[0][0] - out[0][1].input_arrival <= TICK


# -- stalls ------------------------------------------------------------------------------------------------


async def stream(lease, pcm, start, *, stall=None):
    """``pcm`` in 40 ms pages at real time from ``start``; ``stall`` = (from, seconds): the pages due in that
    window are held, then arrive all at once at its end (as a TCP retransmission delivers them)."""
    held = []
    for k in range(len(pcm) // PAGE):
        due = start + k * PAGE / 24_000
        if stall is not None and stall[0] <= due < stall[0] + stall[1]:
            held.append(pcm[k * PAGE : (k + 1) * PAGE])
            continue
        await trio.sleep_until(due)
        if held:
            for page in held:
                lease.push_input(page, trio.current_time())
            held = []
        lease.push_input(pcm[k * PAGE : (k + 1) * PAGE], trio.current_time())


def heard(out, pcm):
    """Which of ``pcm``'s frames the model heard (the echo gives back exactly what each tick took)."""
    frames = {frame.pcm.tobytes() for _, frame in out}
    return [pcm[i * FRAME : (i + 1) * FRAME].tobytes() in frames for i in range(len(pcm) // FRAME)]


def turnaround(out, since, until=np.inf):
    """Median time from a frame's last sample arriving to its echo being read, over frames read in [since, until)."""
    waits = [at - frame.input_arrival for at, frame in out if frame.input_arrival is not None and since <= at < until]
    return float(np.median(waits))


@pytest.mark.parametrize("seconds", [0.5, 1.0, 2.5, 5.0])
@pytest.mark.parametrize("during", ["speech", "silence"])
async def test_an_uplink_stall_loses_no_speech_and_leaves_no_lasting_latency(
    nursery, autojump_clock, monkeypatch, speech, during, seconds
):
    run_engine_calls(monkeypatch, inline_runner(0.010))
    actor = EngineActor(EchoEngine(1, prefill_steps=0, delay_frames=0), ActorSettings(input_backlog_seconds=4.0))
    await nursery.start(actor.run)
    silent = [is_silent(speech[i * FRAME : (i + 1) * FRAME]) for i in range(len(speech) // FRAME)]
    # The stall: in the first spoken stretch of 1 s or more after 2 s, or in the longest pause.
    starts = (
        [i for i in range(25, len(silent) - 12) if not any(silent[i : i + 12])]
        if during == "speech"
        else [max(range(25, len(silent)), key=lambda i: sum(silent[i : i + 25]))]
    )
    out = []
    with actor.lease(Conversation()) as lease:
        await begun(lease)
        nursery.start_soon(collect, lease, out)
        start = trio.current_time() + 0.010
        stall_at = start + starts[0] * TICK
        await stream(lease, speech, start, stall=(stall_at, seconds))
        await trio.sleep(1.0)
    was_heard = heard(out, speech)
    lost_speech = [i for i, (s, h) in enumerate(zip(silent, was_heard)) if not s and not h]
    beyond = max(0.0, seconds - 4.0) * 12.5 + (1 if seconds > 4.0 else 0)  # past the 4 s backlog the oldest go
    assert len(lost_speech) <= beyond, lost_speech
    assert actor.metrics.frames_dropped.labels("input_backlog")._value.get() <= beyond + 1
    before = turnaround(out, start + 1.0, stall_at)
    after = turnaround(out, stall_at + seconds + 4.0, start + len(speech) / 24_000)
    assert after <= before + 0.040, (before, after)


async def test_the_grid_of_a_conversation_that_ended_is_not_the_next_ones(nursery, autojump_clock, monkeypatch, caplog):
    """One conversation ends; the next one's caller sends its first frame seconds later: its ticks start then,
    with no stale deadline to catch up with (no tick skipped, no warning)."""
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(CountingEcho(1, prefill_steps=0, delay_frames=0))
    await nursery.start(actor.run)
    with actor.lease(Conversation()) as first:
        await begun(first)
        first.push_input(np.full(FRAME, 0.5, np.float32), trio.current_time())
        await trio.sleep(1.0)
    with actor.lease(Conversation()) as second:
        await begun(second)
        await trio.sleep(2.0)  # its caller starts late
        out = []
        nursery.start_soon(collect, second, out)
        second.push_input(np.full(FRAME, 0.5, np.float32), trio.current_time())
        await trio.sleep(1.0)
    assert actor.ticks_skipped == 0 and "behind" not in caplog.text
    assert len(out) == 13  # a tick at its first frame, then one every 80 ms


# -- the way back: a reader that stalls ----------------------------------------------------------------------


async def test_a_reader_that_stalls_gets_every_spoken_frame_and_every_text_then_real_time(
    nursery, autojump_clock, monkeypatch, speech
):
    """The session's reader is stuck for 2.5 s (its client's downlink held), then reads again: nothing the
    model said is lost, its silent frames go instead, and from then on the reader keeps up with the ticks."""
    run_engine_calls(monkeypatch, inline_runner())
    actor = EngineActor(EchoEngine(1, prefill_steps=0, delay_frames=0), ActorSettings(output_backlog_seconds=4.0))
    await nursery.start(actor.run)
    held = [False]
    out = []
    with actor.lease(Conversation()) as lease:
        await begun(lease)
        nursery.start_soon(collect, lease, out, lambda: held[0])
        start = trio.current_time() + 0.010

        async def downlink() -> None:
            await trio.sleep_until(start + 2.0)
            held[0] = True
            await trio.sleep(2.5)
            held[0] = False

        nursery.start_soon(downlink)
        await stream(lease, speech, start)
        await trio.sleep(1.0)
    frames = [frame for _, frame in out]
    texts = "".join(frame.text or "" for frame in frames)
    assert texts == "".join(f" {n}" for n in range(lease.frames_delivered))  # every text piece, in order
    said = {
        speech[i * FRAME : (i + 1) * FRAME].tobytes()
        for i in range(len(speech) // FRAME)
        if not is_silent(speech[i * FRAME : (i + 1) * FRAME])
    }
    assert said <= {frame.pcm.tobytes() for frame in frames}  # every spoken frame of the model's reached it
    assert lease.output_skipped > 0 and lease.output_dropped == 0  # silence went instead, nothing else
    late = [at - frame.delivered for at, frame in out if at > start + 4.5 + 4.0]
    assert late and max(late) < TICK  # from 4 s after it reads again, it gets each frame as it is made
