"""A dropped Realtime or Live connection pauses a call that asked for it (``?resumable=1``); ``?resume=TOKEN``
goes on with it (``--resume-seconds``).

The real server on the virtual network and clock, with the echo engine: a
frame of value ``v`` comes back a frame later, and its text is the row's own
frame count (" 0", " 1", ...), which a paused row does not advance.  Every
event is validated against the ``openai`` SDK's own server-event union, and the
token is read back through the SDK's parsed model.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import trio

from _helpers.live import PATH as LIVE
from _helpers.live import SERVER_EVENT as LIVE_EVENT
from _helpers.live import LiveClient
from pplex_trio.engine import EchoEngine

openai = pytest.importorskip("openai")
from openai.types.realtime import RealtimeServerEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

REALTIME = "/v1/realtime"
REALTIME_EVENT = TypeAdapter(RealtimeServerEvent)
FRAME = 1920


class Conn:
    """A Realtime or Live connection as a test reads it: every event validated, and kept."""

    def __init__(self, receive, send, validate):
        self.receive, self.send, self.validate = receive, send, validate
        self.events: list[dict] = []

    # (LiveClient speaks to a trio-websocket connection: these two make a bad client look like one)
    async def get_message(self):
        return await self.receive()

    async def send_message(self, message):
        await self.send(message)

    async def next(self, kind: str | None = None, timeout: float = 10.0) -> dict:
        with trio.fail_after(timeout):
            while True:
                event = json.loads(await self.receive())
                if not event["type"].startswith("pplex."):  # (our documented queue event is not OpenAI's)
                    self.validate(event)
                self.events.append(event)
                if kind is None or event["type"] == kind:
                    return event

    async def closed(self, timeout: float = 10.0) -> tuple[int | None, list[dict]]:
        """Read until the server closes: its code (None: dropped) and the events on the way."""
        start = len(self.events)
        try:
            while True:
                await self.next(timeout=timeout)
        except Exception as exc:  # (each client says "closed" its own way)
            code = getattr(getattr(exc, "reason", None), "code", None) or getattr(exc, "code", None)
            return code, self.events[start:]


def realtime_token(event: dict) -> str:
    """The token, as an SDK user reads it: from the parsed event's session model (an extra field)."""
    return REALTIME_EVENT.validate_python(event).session.resume_token


def pcm16(value: int) -> bytes:
    return np.full(FRAME, value, "<i2").tobytes()


def append(value: int) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm16(value)).decode()})


def numbers(events: list[dict], kind: str) -> list[int]:
    """The echo's frame numbers among the text deltas of ``kind``."""
    return [int(e["delta"]) for e in events if e["type"] == kind]


async def echoed(conn: Conn, value: int, kind: str) -> None:
    """Read until an audio delta (``kind``) of ``value`` comes back."""
    while True:
        event = await conn.next(kind)
        if abs(int(np.frombuffer(base64.b64decode(event["delta"]), "<i2").mean()) - value) <= 2:
            return


async def slots(handle) -> dict:
    return (await handle.get_json("/health"))["slots"]


# -- Realtime ------------------------------------------------------------------------------------------------

RT_AUDIO, RT_TEXT = "response.output_audio.delta", "response.output_audio_transcript.delta"


async def realtime_call(handle, query: str = "?resumable=1"):
    """A live Realtime call on a connection the test may reset: (the bad client, its events, session.created)."""
    bad = await handle.bad_client(REALTIME + query)
    conn = Conn(bad.receive, bad.send, REALTIME_EVENT.validate_python)
    created = await conn.next("session.created")
    await bad.send(append(1000))
    await conn.next("response.created")
    await echoed(conn, 1000, RT_AUDIO)
    return bad, conn, created


async def test_realtime_a_reset_call_resumes_with_its_session_and_the_model_where_it_paused(
    virtual_server, autojump_clock
):
    handle = await virtual_server(slots=1)
    bad, conn, created = await realtime_call(handle)
    assert "resume_token" not in created["session"]  # (given once the call is live)
    (updated,) = [e for e in conn.events if e["type"] == "session.updated"]
    token = realtime_token(updated)
    assert len(token) >= 22 and updated["session"]["id"] == created["session"]["id"]
    await bad.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "A nun."}}))
    assert realtime_token(await conn.next("session.updated")) == token  # (the token, in every session object)
    await bad.send(append(1500))  # (heard once the new persona's prompt has run)
    await echoed(conn, 1500, RT_AUDIO)
    before = numbers(conn.events, RT_TEXT)
    bad.reset()
    await trio.sleep(5)  # the outage, well within the window
    assert (await slots(handle))["held"] == 1
    async with handle.open_websocket(REALTIME) as other:  # (session ids are unique: the same one says something)
        assert json.loads(await other.get_message())["session"]["id"] != created["session"]["id"]
    async with handle.open_websocket(REALTIME + "?model=personaplex&resume=" + token) as ws:
        again = Conn(ws.get_message, ws.send_message, REALTIME_EVENT.validate_python)
        created_again = await again.next()
        assert created_again["type"] == "session.created"  # the first event, as on any connection
        session = created_again["session"]
        assert session["id"] == created["session"]["id"] and session["instructions"] == "A nun."
        new_token = realtime_token(created_again)
        assert new_token != token
        await again.next("response.created")
        await ws.send_message(append(2000))
        await echoed(again, 2000, RT_AUDIO)
    after = numbers(again.events, RT_TEXT)
    # The row was not stepped while paused: its frame count goes on from where the dropped connection left it
    # (a few frames sent into the dead connection are lost), not 5 s (62 frames) later.
    assert after == list(range(after[0], after[0] + len(after))) and before[-1] < after[0] <= before[-1] + 8
    assert (await handle.resumes())["resumed"] == 1


async def test_realtime_at_the_windows_edge_it_resumes_after_it_an_error_and_1008(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, resume_seconds=4)
    bad, conn, _ = await realtime_call(handle)
    token = realtime_token(next(e for e in conn.events if e["type"] == "session.updated"))
    bad.reset()
    await trio.sleep(3.9)
    again = await handle.bad_client(REALTIME + "?resume=" + token)
    conn = Conn(again.receive, again.send, REALTIME_EVENT.validate_python)
    next_token = realtime_token(await conn.next("session.created"))
    await again.send(append(500))
    await echoed(conn, 500, RT_AUDIO)
    again.reset()
    await trio.sleep(4.2)  # paused again, and this window lapses
    assert (await slots(handle))["free"] == 1
    async with handle.open_websocket(REALTIME + "?resume=" + next_token) as ws:
        late = Conn(ws.get_message, ws.send_message, REALTIME_EVENT.validate_python)
        code, events = await late.closed()
    assert code == 1008 and [e["type"] for e in events] == ["error"]
    assert "unknown, used or expired" in events[0]["error"]["message"]
    assert (await handle.resumes())["expired"] == 1


async def test_realtime_a_wrong_or_foreign_token_is_an_error_then_1008(virtual_server, autojump_clock):
    handle = await virtual_server(slots=2)
    raw = await handle.bad_client("/v1/audio/duplex")
    await raw.send(json.dumps({"type": "open"}))
    while (ready := json.loads(await raw.receive()))["type"] != "ready":
        pass
    raw.reset()  # a raw call, paused: its token is not Realtime's
    for token in ("not-a-token", ready["resume"]):
        async with handle.open_websocket(REALTIME + "?resume=" + token) as ws:
            code, events = await Conn(ws.get_message, ws.send_message, REALTIME_EVENT.validate_python).closed()
        assert code == 1008 and [e["type"] for e in events] == ["error"]
    await trio.sleep(3)
    assert (await slots(handle))["free"] == 2  # the raw call presented here ended: nothing is left held


async def test_realtime_not_asked_no_token_and_a_drop_ends_the_call(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    bad, conn, created = await realtime_call(handle, query="")
    assert all("resume_token" not in e.get("session", {}) for e in conn.events)
    assert [e["type"] for e in conn.events].count("session.updated") == 0  # (nothing new for such a client)
    bad.reset()
    await trio.sleep(1)
    assert (await slots(handle))["free"] == 1 and await handle.resumes() == {
        "resumed": 0,
        "expired": 0,
        "refused": 0,
        "wrong_token": 0,
    }


async def test_realtime_a_drop_before_the_call_is_live_ends_it(virtual_server, autojump_clock):
    # Queued behind a live call, then preparing (its prompt): the token is not given yet, so a drop ends it.
    slow_prompt = EchoEngine(1, prefill_steps=4, prefill_seconds=0.5)  # a 2 s prompt
    handle = await virtual_server(slow_prompt, slots=1, keepalive_interval=0.1)
    first, _, _ = await realtime_call(handle)
    queued = await handle.bad_client(REALTIME + "?resumable=1")
    conn = Conn(queued.receive, queued.send, REALTIME_EVENT.validate_python)
    await conn.next("session.created")
    await queued.send(append(100))
    assert (await conn.next("pplex.queued"))["position"] == 1
    queued.reset()
    await trio.sleep(0.5)
    assert len((await handle.get_json("/api/sessions"))["sessions"]) == 1
    await first.send(append(0))
    first.close()  # (a close, not a hang-up: paused)
    await trio.sleep(25)  # its window lapses
    assert (await slots(handle))["free"] == 1 and (await handle.resumes())["expired"] == 1
    preparing = await handle.bad_client(REALTIME + "?resumable=1")
    conn = Conn(preparing.receive, preparing.send, REALTIME_EVENT.validate_python)
    await conn.next("session.created")
    await preparing.send(append(100))
    await trio.sleep(0.5)
    assert [s["state"] for s in (await handle.get_json("/api/sessions"))["sessions"]] == ["preparing"]
    preparing.reset()
    await trio.sleep(3)
    assert (await slots(handle))["free"] == 1 and (await handle.resumes())["expired"] == 1


# -- Live ----------------------------------------------------------------------------------------------------

LIVE_AUDIO, LIVE_TEXT = "session.output_audio.delta", "session.output_transcript.delta"


def live_token(event: dict) -> str:
    """The token, as an SDK user reads it: from the parsed event's session model (an extra field)."""
    return LIVE_EVENT.validate_python(event).session.resume_token


async def live_call(handle, query: str = "?resumable=1"):
    bad = await handle.bad_client(LIVE + query)
    conn = Conn(bad.receive, bad.send, LIVE_EVENT.validate_python)
    started = await LiveClient(conn).start(instructions="Be kind.", audio={"output": {"voice": "marin"}})
    await conn.send(json.dumps({"type": "session.input_audio.append", "audio": base64.b64encode(pcm16(1000)).decode()}))
    await echoed(conn, 1000, LIVE_AUDIO)
    return bad, conn, started


async def test_live_a_reset_call_resumes_with_its_session_and_settings_sent_are_ignored(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    bad, conn, started = await live_call(handle)
    token = live_token(started)
    before = numbers(conn.events, LIVE_TEXT)
    bad.reset()
    await trio.sleep(5)
    assert (await slots(handle))["held"] == 1
    async with handle.open_websocket(handle.ws_url + LIVE + "?resume=" + token) as ws:
        again = Conn(ws.get_message, ws.send_message, LIVE_EVENT.validate_python)
        restarted = await LiveClient(again).start(instructions="Be rude.")
        session = restarted["session"]
        assert session["id"] == started["session"]["id"] and session["instructions"] == "Be kind."
        assert session["audio"] == started["session"]["audio"] and live_token(restarted) != token
        notice = await again.next()
        assert notice["type"] == "info" and notice["code"] == "resume_settings_ignored"
        await ws.send_message(
            json.dumps({"type": "session.input_audio.append", "audio": base64.b64encode(pcm16(2000)).decode()})
        )
        await echoed(again, 2000, LIVE_AUDIO)
    after = numbers(again.events, LIVE_TEXT)
    assert after == list(range(after[0], after[0] + len(after))) and before[-1] < after[0] <= before[-1] + 8
    assert (await handle.resumes())["resumed"] == 1


async def test_live_at_the_windows_edge_it_resumes_after_it_an_error_and_1008(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, resume_seconds=4)
    bad, _, started = await live_call(handle)
    bad.reset()
    await trio.sleep(3.9)
    again = await handle.bad_client(LIVE + "?resume=" + live_token(started))
    conn = Conn(again.receive, again.send, LIVE_EVENT.validate_python)
    next_token = live_token(await LiveClient(conn).start())
    again.reset()
    await trio.sleep(4.2)
    assert (await slots(handle))["free"] == 1
    for token in (next_token, "not-a-token"):
        async with handle.open_websocket(handle.ws_url + LIVE + "?resume=" + token) as ws:
            late = Conn(ws.get_message, ws.send_message, LIVE_EVENT.validate_python)
            await late.send(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
            code, events = await late.closed()
        assert code == 1008 and "error" in [e["type"] for e in events]
    assert await handle.resumes() == {"resumed": 1, "expired": 1, "refused": 0, "wrong_token": 2}


async def test_live_session_close_ends_the_call_and_a_drop_while_flushing_too(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    bad, conn, _ = await live_call(handle)
    await bad.send(json.dumps({"type": "session.close"}))
    await conn.next("session.closed")
    await trio.sleep(1)
    assert (await slots(handle))["free"] == 1  # the protocol's own hang-up: nothing paused
    bad, conn, _ = await live_call(handle)
    await bad.send(json.dumps({"type": "session.close"}))
    bad.reset()  # while its last words are flushed: the call is over, not paused
    await trio.sleep(1)
    assert (await slots(handle))["free"] == 1 and (await handle.resumes())["expired"] == 0


async def test_realtime_session_close_ends_the_call_at_once_not_paused(virtual_server, autojump_clock):
    """OpenAI's Realtime has no hang-up; pplex-trio's ``session.close`` (Live's name) is one: the call ends, its
    slot is free at once, and its token resumes nothing."""
    handle = await virtual_server(slots=1)
    bad, conn, _ = await realtime_call(handle)
    token = realtime_token(next(e for e in conn.events if e["type"] == "session.updated"))
    await bad.send(json.dumps({"type": "session.close"}))
    await trio.sleep(1)
    assert (await slots(handle))["free"] == 1 and (await handle.resumes())["expired"] == 0
    assert 'pplex_sessions_ended_total{outcome="hangup",protocol="realtime"} 1.0' in await handle.metrics()
    async with handle.open_websocket(REALTIME + "?resume=" + token) as ws:
        code, _events = await Conn(ws.get_message, ws.send_message, REALTIME_EVENT.validate_python).closed()
    assert code == 1008


# -- a resume while the old connection is still open ---------------------------------------------------------


async def test_realtime_a_resume_while_the_old_connection_lives_takes_the_call_over(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    old, conn, created = await realtime_call(handle)
    token = realtime_token(next(e for e in conn.events if e["type"] == "session.updated"))
    async with handle.open_websocket(REALTIME + "?resume=" + token) as ws:
        code, events = await conn.closed()
        old.close()  # (the server closed it: its client lets go of the socket)
        assert code == 1008 and [e["type"] for e in events if e["type"] == "error"] == ["error"]
        assert "resumed on another connection" in next(e for e in events if e["type"] == "error")["error"]["message"]
        new = Conn(ws.get_message, ws.send_message, REALTIME_EVENT.validate_python)
        taken = await new.next("session.created")
        assert taken["session"]["id"] == created["session"]["id"] and realtime_token(taken) != token
        await ws.send_message(append(700))
        await echoed(new, 700, RT_AUDIO)
        assert len((await handle.get_json("/api/sessions"))["sessions"]) == 1
    assert (await handle.resumes())["resumed"] == 1


async def test_live_a_resume_while_the_old_connection_lives_takes_the_call_over(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    old, conn, started = await live_call(handle)
    async with handle.open_websocket(handle.ws_url + LIVE + "?resume=" + live_token(started)) as ws:
        new = Conn(ws.get_message, ws.send_message, LIVE_EVENT.validate_python)
        await new.send(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
        code, events = await conn.closed()
        old.close()
        assert code == 1008
        (error,) = [e for e in events if e["type"] == "error"]
        assert "resumed on another connection" in error["error"]["message"]
        taken = await new.next("session.started")
        assert taken["session"]["id"] == started["session"]["id"] and live_token(taken) != live_token(started)
        await ws.send_message(
            json.dumps({"type": "session.input_audio.append", "audio": base64.b64encode(pcm16(700)).decode()})
        )
        await echoed(new, 700, LIVE_AUDIO)
        assert len((await handle.get_json("/api/sessions"))["sessions"]) == 1
    assert (await handle.resumes())["resumed"] == 1
