"""The session core through every state, on a fake socket and Trio's virtual clock (no hypercorn).

admitting → queued → preparing → live → closing → closed (as ``/api/sessions`` shows them: queued and
preparing are its lease's steps), on both protocols,
with the ways a session ends at each: a normal flush (also with a full output
queue), a bad message, a client that stops reading, an engine failure, a
shutdown, a client that vanishes.  The engine is the echo engine, run inline.
"""

import json

import numpy as np
import pytest
import sphn
import trio

from _helpers import ogg
from _helpers.fake_ws import FakeWebSocket, make_host, running_host, start_session
from pplex_trio._conversation import CloseCode, Outcome
from pplex_trio.engine import EchoEngine
from pplex_trio.server.sessions._raw import RawProtocol
from pplex_trio.server.sessions._session import Ending, Session, SessionState

FRAME = 1920
OPEN = json.dumps({"type": "open"})
CLOSE = json.dumps({"type": "close"})


def events(sent):
    return [json.loads(m) for m in sent if isinstance(m, str)]


def of_type(kind):
    return lambda sent: [e for e in events(sent) if e["type"] == kind]


def pcm_frames(sent):
    return [np.frombuffer(m, dtype="<f4") for m in sent if isinstance(m, bytes)]


def ramp(frames, start=0):
    """Input whose every frame is recognisable: frame k is filled with (start + k + 1) / 1000."""
    return [np.full(FRAME, (start + k + 1) / 1000, dtype="<f4") for k in range(frames)]


def loud(frames, start=0):
    """Like :func:`ramp`, but speech-loud (-26 dBFS and up): a catching-up framer skips only silence."""
    return [np.full(FRAME, (start + k + 1) / 20, dtype="<f4") for k in range(frames)]


async def wait_state(session, state):
    with trio.fail_after(30):
        while session.status != state:
            await trio.sleep(0.001)


async def test_raw_session_walks_every_state_and_flushes_everything(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery, slots=1, model="echo:delay=0,prompt=2")
    first = await start_session(nursery, host, "raw")
    first.ws.client_send(OPEN)
    await first.ws.wait_for(of_type("ready"))
    assert first.session.status == "live"

    second = await start_session(nursery, host, "raw")
    assert second.session.status == "admitting"  # nothing read yet
    second.ws.client_send(OPEN)
    queued = await second.ws.wait_for(of_type("queued"))
    assert queued[0] == {"type": "queued", "position": 1} and second.session.status == "queued"
    await second.ws.wait_for(lambda sent: len(of_type("queued")(sent)) >= 3)  # repeated every keepalive interval

    first.ws.client_send(CLOSE)  # the first conversation ends with nothing pending
    assert await first.ws.wait_closed() == (1000, "")
    assert of_type("done")(first.ws.sent)
    await wait_state(second.session, "preparing")
    await second.ws.wait_for(of_type("ready"))
    assert second.session.status == "live"

    frames = ramp(5)
    for frame in frames:
        second.ws.client_send(frame.tobytes())
    second.ws.client_send(CLOSE)
    assert await second.ws.wait_closed() == (1000, "")
    await second.done.wait()
    assert second.session.status == "closed"
    out = pcm_frames(second.ws.sent)
    # The flush runs every frame through the engine (an echo without delay) before "done".
    nonsilent = [f for f in out if f.any()]
    assert [f[0] for f in nonsilent] == pytest.approx([f[0] for f in frames])
    assert events(second.ws.sent)[-1] == {"type": "done"}
    await trio.sleep(0.2)  # the slot drains at the next tick (a tick and the early-start window away at most)
    assert host.actor.statistics().slots_free == 1 and not host.sessions


async def test_flush_with_a_full_output_queue_ends_with_done_after_what_survived(nursery, autojump_clock, monkeypatch):
    """The client stops reading; its output queue overflows (oldest audio first, text kept); then it reads."""
    host = await running_host(monkeypatch, nursery, slots=1, output_backlog_seconds=0.16, client_timeout=30)
    run = await start_session(nursery, host, "raw")
    run.ws.client_send(OPEN)
    await run.ws.wait_for(of_type("ready"))
    run.ws.reading = False
    for frame in ramp(8):  # at real-time pace
        run.ws.client_send(frame.tobytes())
        await trio.sleep(0.08)
    run.ws.client_send(CLOSE)
    await trio.sleep(2.0)  # every frame has been stepped; the outbox holds what it can
    lease = run.session.lease
    assert lease.frames_delivered >= 8 and lease.output_dropped >= lease.frames_delivered - 3
    run.ws.resume_reading()
    assert await run.ws.wait_closed() == (1000, "")
    assert events(run.ws.sent)[-1] == {"type": "done"}
    texts = "".join(e["text"] for e in of_type("text")(run.ws.sent))
    assert texts == "".join(f" {n}" for n in range(lease.frames_delivered))  # no text piece lost
    assert len(pcm_frames(run.ws.sent)) < lease.frames_delivered  # but audio was


async def test_a_client_that_never_reads_again_is_dropped_after_the_client_timeout(
    nursery, autojump_clock, monkeypatch
):
    host = await running_host(
        monkeypatch, nursery, slots=1, output_backlog_seconds=0.16, client_timeout=3, resume_seconds=0
    )
    run = await start_session(nursery, host, "raw")
    run.ws.client_send(OPEN)
    await run.ws.wait_for(of_type("ready"))
    run.ws.reading = False
    started = trio.current_time()
    await run.done.wait()
    assert run.session.ending == Ending(
        CloseCode.POLICY, "client did not read its messages in time", Outcome.CLIENT_TIMEOUT
    )
    assert trio.current_time() - started < 3 + 1 + 0.2  # the timeout, then at most the 1 s close budget
    assert run.ws.closed is None  # it could not even be told: the session gave up on it
    await trio.sleep(0.2)  # the slot drains at the next tick
    assert host.actor.table.rows[0] is None


@pytest.mark.parametrize("phase", ["admitting", "queued", "preparing", "live"])
@pytest.mark.parametrize("protocol", ["raw", "moshi"])
async def test_a_client_that_vanishes_in_any_phase_frees_everything(
    nursery, autojump_clock, phase, protocol, monkeypatch
):
    host = await running_host(monkeypatch, nursery, slots=1, model="echo:prompt=50", resume_seconds=0)
    blocker = None
    if phase == "queued":
        blocker = await start_session(nursery, host, "raw")
        blocker.ws.client_send(OPEN)
        await wait_state(blocker.session, "preparing")
    run = await start_session(nursery, host, protocol)
    if protocol == "raw" and phase != "admitting":
        run.ws.client_send(OPEN)
    target = phase
    if protocol == "moshi" and phase == "admitting":
        target = "preparing"  # a Moshi conversation is admitted from its query, at once
    await wait_state(run.session, target)
    run.scope.cancel()  # what the ASGI socket does when the connection drops
    await run.done.wait()
    assert run.session.status == "closed" and run.session not in host.sessions
    if blocker is not None:
        blocker.scope.cancel()
        await blocker.done.wait()
    await trio.sleep(0.2)
    assert host.actor.statistics().slots_free == 1 and host.actor.statistics().queued == 0
    assert not host.actor.table.busy()


async def test_raw_without_an_open_message_is_told_so(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery, open_timeout=2)
    run = await start_session(nursery, host, "raw")
    assert await run.ws.wait_closed() == (1008, run.ws.closed[1])
    assert "no opening message within 2 s" in of_type("error")(run.ws.sent)[0]["error"]
    assert trio.current_time() == pytest.approx(2.0, abs=0.01)


@pytest.mark.parametrize(
    "message, code, words",
    [
        ("not json", 1007, "JSON"),
        (json.dumps({"type": "open"}), 1008, "already open"),
        (json.dumps({"type": "jump"}), 1003, "unknown message type"),
        (b"\x00\x00\xc0\x7f", 1007, "NaN"),
        (b"abc", 1007, "multiple of 4"),
    ],
)
async def test_raw_bad_messages_while_live_end_with_their_code(
    nursery, autojump_clock, message, code, words, monkeypatch
):
    host = await running_host(monkeypatch, nursery)
    run = await start_session(nursery, host, "raw")
    run.ws.client_send(OPEN)
    await run.ws.wait_for(of_type("ready"))
    run.ws.client_send(message)
    closed = await run.ws.wait_closed()
    assert closed[0] == code
    assert words in of_type("error")(run.ws.sent)[0]["error"]
    assert run.session.ending.outcome is Outcome.PROTOCOL_ERROR


async def test_audio_after_close_is_refused(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery, model="echo:prompt=1")
    run = await start_session(nursery, host, "raw")
    run.ws.client_send(OPEN)
    await run.ws.wait_for(of_type("ready"))
    run.ws.reading = False  # keep the flush from finishing first
    run.ws.client_send(CLOSE)
    run.ws.client_send(np.zeros(FRAME, "<f4").tobytes())
    run.ws.resume_reading()
    assert (await run.ws.wait_closed())[0] == 1008
    assert "audio after" in of_type("error")(run.ws.sent)[0]["error"]


async def test_closing_before_the_conversation_is_live_ends_normally(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery, model="echo:prompt=20")
    run = await start_session(nursery, host, "raw")
    run.ws.client_send(OPEN)
    await wait_state(run.session, "preparing")
    run.ws.client_send(CLOSE)
    assert await run.ws.wait_closed() == (1000, "")
    assert not of_type("ready")(run.ws.sent)


def moshi_pages(pcm):
    writer = sphn.OpusStreamWriter(24000)
    return [page for i in range(0, pcm.size, FRAME) for page in ogg.split_pages(writer.append_pcm(pcm[i : i + FRAME]))]


async def test_moshi_session_pings_while_preparing_then_handshakes_and_echoes(nursery, autojump_clock, monkeypatch):
    host = await running_host(
        monkeypatch, nursery, keepalive_interval=0.5, prompt_position_seconds=0.08, model="echo:prompt=20"
    )
    run = await start_session(nursery, host, "moshi", b"text_prompt=hello&voice_prompt=NATF0.pt")
    await run.ws.wait_for(lambda sent: sent.count(b"\x06") >= 2)  # pings while the prompt runs (a slow 1.6 s)
    assert run.session.status == "preparing"
    await run.ws.wait_for(lambda sent: b"\x00" in sent)
    assert run.session.status == "live"
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(FRAME * 10) / 24000)).astype(np.float32)
    for page in moshi_pages(tone):
        run.ws.client_send(b"\x01" + page)
        await trio.sleep(0.04)
    audio = await run.ws.wait_for(lambda sent: [m for m in sent if m[:1] == b"\x01"][5:] or None)
    assert audio
    texts = [m[1:].decode() for m in run.ws.sent if m[:1] == b"\x02"]
    assert texts[:3] == [" 0", " 1", " 2"]
    assert run.session.stats.frames_decoded >= 8
    assert host.engine.started[0][1].persona == "hello"


async def test_moshi_garbage_audio_is_refused_with_1007_and_an_error_message(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery)
    run = await start_session(nursery, host, "moshi")
    await run.ws.wait_for(lambda sent: b"\x00" in sent)
    run.ws.client_send(b"\x01" + b"definitely not ogg" * 10)
    closed = await run.ws.wait_closed()
    assert closed[0] == 1007
    assert [m for m in run.ws.sent if m[:1] == b"\x05"][0].startswith(b"\x05audio is not a valid Ogg Opus stream")


async def test_unknown_voice_and_bad_parameters_are_refused_at_admission(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery)
    for query, words in (
        (b"voice_prompt=NOPE.pt", "unknown voice_prompt"),
        (b"text_temperature=hot", "text_temperature must be a number"),
    ):
        run = await start_session(nursery, host, "moshi", query)
        assert (await run.ws.wait_closed())[0] == 1008
        assert words in [m for m in run.ws.sent if m[:1] == b"\x05"][0].decode()
        assert run.session.ending.outcome is Outcome.BAD_REQUEST and run.session.lease is None


async def test_a_full_queue_is_refused_with_1013(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery, slots=1, queue_size=0)
    first = await start_session(nursery, host, "moshi")
    await first.ws.wait_for(lambda sent: b"\x00" in sent)
    second = await start_session(nursery, host, "moshi")
    assert (await second.ws.wait_closed())[0] == 1013
    assert second.session.ending.outcome is Outcome.QUEUE_FULL


async def test_queue_timeout_closes_with_1013(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery, slots=1, queue_timeout=3)
    first = await start_session(nursery, host, "moshi")
    await first.ws.wait_for(lambda sent: b"\x00" in sent)
    second = await start_session(nursery, host, "moshi")
    await wait_state(second.session, "queued")
    queued_at = trio.current_time()
    assert (await second.ws.wait_closed())[0] == 1013
    assert trio.current_time() - queued_at == pytest.approx(3.0, abs=0.01)
    assert second.session.ending.outcome is Outcome.QUEUE_TIMEOUT


class FailingEcho(EchoEngine):
    fail = False

    def step(self, modes, pcm):
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().step(modes, pcm)


@pytest.mark.parametrize("protocol", ["raw", "moshi"])
async def test_an_engine_failure_ends_live_sessions_with_1011(nursery, autojump_clock, protocol, monkeypatch):
    engine = FailingEcho(1, prefill_steps=1)
    host = await running_host(monkeypatch, nursery, engine)
    run = await start_session(nursery, host, protocol)
    if protocol == "raw":
        run.ws.client_send(OPEN)
    await wait_state(run.session, "live")
    engine.fail = True
    assert (await run.ws.wait_closed())[0] == 1011
    assert run.session.ending.outcome is Outcome.ENGINE_ERROR
    engine.fail = False
    again = await start_session(nursery, host, protocol)  # the server carries on
    if protocol == "raw":
        again.ws.client_send(OPEN)
    await wait_state(again.session, "live")


@pytest.mark.parametrize("phase", ["queued", "preparing", "live"])
async def test_shutdown_tells_every_phase_going_away(nursery, autojump_clock, phase, monkeypatch):
    host = await running_host(monkeypatch, nursery, slots=1, model="echo:prompt=30")
    first = await start_session(nursery, host, "moshi")
    second = await start_session(nursery, host, "moshi")
    target = first if phase != "queued" else second
    await wait_state(first.session, "preparing")
    await wait_state(target.session, phase)
    host.begin_shutdown()
    for run in (first, second):
        assert (await run.ws.wait_closed())[0] == 1001
        assert any(m.startswith(b"\x05this server is shutting down;") for m in run.ws.sent)
    late = await start_session(nursery, host, "moshi")
    assert (await late.ws.wait_closed())[0] == 1001  # refused from then on


def test_every_outcome_keeps_its_label_and_has_its_close_code():
    """The labels are what dashboards and call records read: renaming one breaks them."""
    assert {outcome.value for outcome in Outcome} == {
        "completed",
        "hangup",
        "time_limit",
        "client_closed",
        "client_timeout",
        "bad_request",
        "protocol_error",
        "queue_full",
        "queue_timeout",
        "rejected",
        "engine_error",
        "engine_stalled",
        "internal_error",
        "taken_over",
        "shutdown",
        "draining",
    }
    assert [outcome for outcome in Outcome if outcome.code is None] == [Outcome.CLIENT_CLOSED]  # (no close of ours)
    assert Outcome.QUEUE_FULL.code == CloseCode.TRY_AGAIN_LATER and Outcome.SHUTDOWN.code == CloseCode.GOING_AWAY


def test_a_session_refuses_a_transition_its_state_machine_does_not_have(monkeypatch):
    session = Session(FakeWebSocket(), RawProtocol(max_prompt_chars=10), make_host(monkeypatch))
    assert {state.value for state in SessionState} == {"admitting", "live", "closing", "closed"}  # (its own)
    with pytest.raises(RuntimeError, match="no transition from admitting to admitting"):
        session._enter(SessionState.ADMITTING)
    session._enter(SessionState.LIVE)
    session._enter(SessionState.CLOSING)
    with pytest.raises(RuntimeError, match="no transition from closing to live"):
        session._enter(SessionState.LIVE)


async def test_raw_audio_sent_before_ready_is_heard(nursery, autojump_clock, monkeypatch):
    """A client that talks at once: what it says while the prompt runs (0.8 s here) reaches the model."""
    host = await running_host(monkeypatch, nursery, prompt_position_seconds=0.04, model="echo:delay=0,prompt=20")
    run = await start_session(nursery, host, "raw")
    run.ws.client_send(OPEN)
    for frame in loud(6):  # said before "ready"
        run.ws.client_send(frame.tobytes())
        await trio.sleep(0.080)
    assert run.session.status == "preparing" and not of_type("ready")(run.ws.sent)
    await run.ws.wait_for(of_type("ready"))
    for frame in loud(4, start=6):  # and after it
        run.ws.client_send(frame.tobytes())
    run.ws.client_send(CLOSE)
    assert await run.ws.wait_closed() == (1000, "")
    heard = [f[0] for f in pcm_frames(run.ws.sent) if f.any()]
    assert heard == pytest.approx([f[0] for f in loud(10)])  # every frame, in order: nothing lost


async def test_raw_audio_then_close_before_ready_is_still_answered(nursery, autojump_clock, monkeypatch):
    host = await running_host(monkeypatch, nursery, prompt_position_seconds=0.04, model="echo:delay=0,prompt=20")
    run = await start_session(nursery, host, "raw")
    run.ws.client_send(OPEN)
    for frame in loud(3):
        run.ws.client_send(frame.tobytes())
    run.ws.client_send(CLOSE)
    assert await run.ws.wait_closed() == (1000, "")
    assert of_type("ready")(run.ws.sent) and of_type("done")(run.ws.sent)
    assert [f[0] for f in pcm_frames(run.ws.sent) if f.any()] == pytest.approx([f[0] for f in loud(3)])


async def test_moshi_audio_before_the_handshake_is_not_heard(nursery, autojump_clock, monkeypatch):
    """The Moshi protocol keeps its semantics: the client waits for 0x00 (audio before it is dropped)."""
    host = await running_host(monkeypatch, nursery, prompt_position_seconds=0.04, model="echo:delay=0,prompt=20")
    run = await start_session(nursery, host, "moshi", b"text_prompt=hello&voice_prompt=NATF0.pt")
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(FRAME * 6) / 24000)).astype(np.float32)
    for page in moshi_pages(tone):
        run.ws.client_send(b"\x01" + page)
    await run.ws.wait_for(lambda sent: b"\x00" in sent)
    await trio.sleep(1.0)
    assert host.actor.table.rows[0].frames_consumed == 0  # the early pages were decoded, then dropped
