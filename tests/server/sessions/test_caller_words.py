"""The caller's words on every protocol, from the echo engine's scripted transcript (virtual clock).

The echo engine "hears" ``PIECES`` at a conversation's frames and says the turn ended at ``TURN_END``;
each protocol's events are checked against the ``openai`` SDK's own types where it has them.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import trio

from pplex_trio.engine import EchoEngine
from pplex_trio.engine._echo import scripted_transcript

pydantic = pytest.importorskip("pydantic")
openai_ga = pytest.importorskip("openai.types.realtime")
openai_beta = pytest.importorskip("openai.types.beta.realtime")

PIECES = {6: " hel", 7: "lo", 9: " world"}
TURN_END = 16
LOUD, QUIET = 12, 30  # frames the caller speaks, then is silent
REALTIME = {
    "ga": pydantic.TypeAdapter(openai_ga.RealtimeServerEvent),
    "beta": pydantic.TypeAdapter(openai_beta.RealtimeServerEvent),
}


def _engine(*, head: bool = True) -> EchoEngine:
    script = scripted_transcript(PIECES, {TURN_END})
    if not head:
        inner = script
        script = lambda frame, pcm: (inner(frame, pcm)[0], None)  # noqa: E731
    return EchoEngine(2, prefill_steps=2, transcript=script, transcript_delay=0.4)


def _caller_frames() -> list[np.ndarray]:
    t = np.arange(1920) / 24_000
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return [tone] * LOUD + [np.zeros(1920, np.float32)] * QUIET


def _pcm16(frame: np.ndarray) -> str:
    return base64.b64encode((frame * 32767).astype("<i2").tobytes()).decode()


async def _realtime_call(handle, dialect: str, session: dict) -> list[dict]:
    """A Realtime call that asks for the caller's words: every event received, each checked by the SDK's type."""
    subprotocols = ["realtime", "openai-beta.realtime-v1"] if dialect == "beta" else ["realtime"]
    received: list[dict] = []
    async with handle.open_websocket("/v1/realtime", subprotocols=subprotocols) as ws:

        async def read() -> None:
            while True:
                event = json.loads(await ws.get_message())
                REALTIME[dialect].validate_python(event)
                received.append(event)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await ws.send_message(json.dumps({"type": "session.update", "session": session}))
            for frame in _caller_frames():
                await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": _pcm16(frame)}))
                await trio.sleep(0.08)
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    return received


ASK = {
    "ga": {"type": "realtime", "audio": {"input": {"transcription": {"model": "kyutai/stt-1b-en_fr"}}}},
    "beta": {"input_audio_transcription": {"model": "whisper-1"}},
}


@pytest.mark.parametrize("dialect", ["ga", "beta"])
async def test_realtime_sends_the_callers_words_in_the_item_of_their_speech(virtual_server, autojump_clock, dialect):
    handle = await virtual_server(_engine())
    events = await _realtime_call(handle, dialect, ASK[dialect])
    kinds = [e["type"] for e in events]
    (started,) = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    item = started["item_id"]
    deltas = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert [d["delta"] for d in deltas] == [" hel", "lo", " world"] and {d["item_id"] for d in deltas} == {item}
    (completed,) = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert completed["item_id"] == item and completed["transcript"] == "hello world"
    created = "conversation.item.created" if dialect == "beta" else "conversation.item.added"
    (added,) = [e for e in events if e["type"] == created and e["item"]["role"] == "user"]
    assert added["item"]["id"] == item
    assert kinds.index(created) < kinds.index("conversation.item.input_audio_transcription.delta")
    updated = next(e for e in events if e["type"] == "session.updated")["session"]
    asked = updated["audio"]["input"]["transcription"] if dialect == "ga" else updated["input_audio_transcription"]
    assert asked is not None


async def test_realtime_without_asking_gets_no_words(virtual_server, autojump_clock):
    handle = await virtual_server(_engine())
    events = await _realtime_call(handle, "ga", {"type": "realtime"})
    assert not [e for e in events if "input_audio_transcription" in e["type"]]


@pytest.mark.parametrize("dialect", ["ga", "beta"])
async def test_asking_a_server_that_transcribes_nothing_is_an_error_naming_the_flag(
    virtual_server, autojump_clock, dialect
):
    handle = await virtual_server()
    events = await _realtime_call(handle, dialect, ASK[dialect])
    (error,) = [e for e in events if e["type"] == "error"]
    assert "--transcribe" in error["error"]["message"] and error["error"]["code"] == "transcription_unavailable"
    assert not [e for e in events if "input_audio_transcription" in e["type"]]


async def test_beta_transcription_session_update_is_answered_when_the_server_transcribes(
    virtual_server, autojump_clock
):
    handle = await virtual_server(_engine())
    async with handle.open_websocket("/v1/realtime", subprotocols=["realtime", "openai-beta.realtime-v1"]) as ws:
        await ws.get_message()  # session.created
        ask = {"type": "transcription_session.update", "session": ASK["beta"]}
        await ws.send_message(json.dumps(ask))
        answer = json.loads(await ws.get_message())
        REALTIME["beta"].validate_python(answer)
        assert answer["type"] == "transcription_session.updated"
        assert answer["session"]["input_audio_transcription"] == {"model": "whisper-1"}


async def test_without_the_head_the_vad_ends_the_turn(virtual_server, autojump_clock):
    handle = await virtual_server(_engine(head=False))
    events = await _realtime_call(handle, "ga", ASK["ga"])
    (completed,) = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert completed["transcript"] == "hello world"


async def test_live_sends_the_callers_words_stamped_where_they_were_said(virtual_server, autojump_clock):
    from _helpers.live import PATH, LiveClient  # (every event it reads is checked by openai.types.live)

    handle = await virtual_server(_engine())
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        client = LiveClient(ws)
        await client.start()
        async with trio.open_nursery() as nursery:

            async def speak() -> None:
                for frame in _caller_frames():
                    await client.append((frame * 32767).astype("<i2").tobytes())
                    await trio.sleep(0.08)

            nursery.start_soon(speak)
            while len(client.of("session.input_transcript.delta")) < 3:
                await client.next()
            nursery.cancel_scope.cancel()
    deltas = client.of("session.input_transcript.delta")
    # frame n is about n × 80 ms - 0.4 s into the caller's audio
    assert [(d["delta"], d["start_ms"], d["end_ms"]) for d in deltas] == [
        (" hel", 80, 160),
        ("lo", 160, 240),
        (" world", 320, 400),
    ]


async def test_the_record_has_both_speakers_voice_tagged_and_the_callers_words_with_their_times(
    virtual_server, autojump_clock, tmp_path
):
    import os

    folder = tmp_path / "records"
    handle = await virtual_server(_engine(), record_dir=folder)
    await _realtime_call(handle, "ga", {"type": "realtime"})  # (the record has them whatever the client asked)
    with trio.fail_after(10):
        while not any(name.endswith(".json") for name in os.listdir(folder)):
            await trio.sleep(0.05)
    (name,) = [name for name in os.listdir(folder) if name.endswith(".json")]
    record = json.loads((folder / name).read_text())
    caller = record["caller"]
    assert [(w["text"], w["start"]) for w in caller["words"]] == [("hello", 0.08), ("world", 0.32)]
    assert [(t["text"], t["by"]) for t in caller["turns"]] == [("hello world", "model")]
    vtt = (folder / name.replace(".json", ".vtt")).read_text()
    assert "00:00:00.080 --> 00:00:00.400\n<v caller>hello world\n" in vtt
    assert "<v agent> " not in vtt and "<v agent>0\n" in vtt  # the echo's frame numbers, the agent's


async def _watched_call(handle) -> tuple[list[dict], dict]:
    """A Realtime call (not asking for the words) with ``/api/sessions`` polled every frame: each side's words
    each time, and the last ``/api/status`` row of the call."""
    seen: list[dict] = []
    rows: list[dict] = []
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            while True:
                await trio.sleep(0.08)
                sessions = (await handle.get_json("/api/sessions"))["sessions"]
                rows.extend((await handle.get_json("/api/status"))["sessions"])
                seen.extend(session["words"] for session in sessions)

        nursery.start_soon(watch)
        await _realtime_call(handle, "ga", {"type": "realtime"})  # (shown whatever the client asked)
        nursery.cancel_scope.cancel()
    return seen, rows[-1]


async def test_sessions_and_status_show_each_sides_latest_words(virtual_server, autojump_clock):
    seen, row = await _watched_call(await virtual_server(_engine()))
    callers = [words["caller"] for words in seen]
    # the open turn's words as they come, then the last turn's (a poll a frame: one may fall between two)
    assert set(callers) <= {"", "hel", "hello", "hello world"} and {"hel", "hello"} & set(callers)
    assert callers == sorted(callers, key=len) and callers[-1] == "hello world"
    # The agent's (the echo's frame numbers): its words since the caller's turn ended, the last 200 characters.
    before = [words["agent"] for words in seen if words["caller"] in ("hel", "hello")][-1]
    after = seen[-1]["agent"]
    assert before.startswith("0 1 2") and int(after.split()[0]) > int(before.split()[-1])
    assert len(after) <= 200 and after.split()[-1].isdigit()
    assert row["words"]["caller"] == "hello world" and row["words"]["agent"]


async def test_sessions_show_no_caller_words_when_the_engine_transcribes_nothing(virtual_server, autojump_clock):
    seen, row = await _watched_call(await virtual_server())
    assert {words["caller"] for words in seen} == {None} and seen[-1]["agent"]
    assert row["words"]["caller"] is None


async def _raw_call(handle) -> list[dict]:
    """A raw call: its text events, in order, each with the number of PCM frames before it."""
    events: list[dict] = []
    frames = 0
    async with handle.open_websocket("/v1/audio/duplex") as ws:
        await ws.send_message(json.dumps({"type": "open"}))
        for frame in _caller_frames():
            await ws.send_message(frame.astype("<f4").tobytes())
        await ws.send_message(json.dumps({"type": "close"}))
        while True:
            message = await ws.get_message()
            if isinstance(message, bytes):
                frames += 1
                continue
            event = json.loads(message)
            if event["type"] == "done":
                break
            if event["type"] == "text":
                events.append({**event, "frames": frames})
    return events


async def test_raw_sends_the_callers_words_marked_as_the_users(virtual_server, autojump_clock):
    events = await _raw_call(await virtual_server(_engine()))
    caller = [e for e in events if e["speaker"] == "user"]
    assert [e["text"] for e in caller] == [" hel", "lo", " world"]
    assert [e["frames"] for e in caller] == [7, 8, 10]  # after the PCM of the tick that wrote it (frame 6: the 7th)
    agent = [e for e in events if e["speaker"] == "agent"]
    assert [e["text"] for e in agent[:3]] == [" 0", " 1", " 2"] and set(events[0]) == {
        "type",
        "text",
        "speaker",
        "frames",
    }


async def test_raw_without_a_transcriber_sends_the_agents_words_only(virtual_server, autojump_clock):
    events = await _raw_call(await virtual_server())
    assert events and {e["speaker"] for e in events} == {"agent"}


async def test_our_raw_client_writes_the_agents_words_not_the_callers(
    virtual_server, autojump_clock, monkeypatch, tmp_path
):
    """``pplex-trio client --protocol raw --text-json``: the server sends both speakers' pieces; the file has the
    agent's only (the caller's own words are not what the model said)."""
    import sphn

    from pplex_trio.client import run_client

    handle = await virtual_server(_engine())
    monkeypatch.setattr(trio, "open_tcp_stream", handle.open_tcp_stream)  # the client's connections: virtual
    sphn.write_wav(str(tmp_path / "in.wav"), np.concatenate(_caller_frames()), 24_000)
    await run_client(
        handle.ws_url, tmp_path / "in.wav", tmp_path / "out.wav", text_json=tmp_path / "text.json", protocol="raw"
    )
    written = [piece["text"] for piece in json.loads((tmp_path / "text.json").read_text())]
    assert written[:3] == [" 0", " 1", " 2"] and all(piece.strip().isdigit() for piece in written)
    assert not {" hel", "lo", " world"} & set(written)
    caller = [e for e in await _raw_call(handle) if e["speaker"] == "user"]  # (which the server did send)
    assert [e["text"] for e in caller] == [" hel", "lo", " world"]


async def _moshi_call(handle, **params) -> list[bytes]:
    """A Moshi call (``params``: its query): every message received after the handshake."""
    from _helpers.ws import moshi_handshake, moshi_url, opus_messages

    received: list[bytes] = []
    async with handle.open_websocket(moshi_url(handle.ws_url, **params)) as ws:
        await moshi_handshake(ws)
        async with trio.open_nursery() as nursery:

            async def read() -> None:
                while True:
                    received.append(await ws.get_message())

            nursery.start_soon(read)
            for pages in opus_messages(np.concatenate(_caller_frames())):
                for page in pages:
                    await ws.send_message(b"\x01" + page)
                await trio.sleep(0.08)
            nursery.cancel_scope.cancel()
    return received


async def test_moshi_sends_the_callers_words_to_a_client_that_asked_as_kind_0x10(virtual_server, autojump_clock):
    handle = await virtual_server(_engine())
    assert (await handle.get_json("/api/info"))["transcribes_caller"] is True  # (the page asks when it says so)
    received = await _moshi_call(handle, transcribe_caller=1)
    assert [m[1:].decode() for m in received if m[0] == 0x10] == [" hel", "lo", " world"]
    assert {m[0] for m in received} == {0x01, 0x02, 0x10}


async def test_moshi_sends_a_client_that_did_not_ask_only_the_official_kinds(virtual_server, autojump_clock):
    handle = await virtual_server(_engine())
    received = await _moshi_call(handle)
    assert received and {m[0] for m in received} == {0x01, 0x02}


async def test_moshi_asking_a_server_that_transcribes_nothing_is_refused_naming_the_flag(
    virtual_server, autojump_clock
):
    from trio_websocket import ConnectionClosed

    from _helpers.ws import moshi_url

    handle = await virtual_server()
    assert (await handle.get_json("/api/info"))["transcribes_caller"] is False
    async with handle.open_websocket(moshi_url(handle.ws_url, transcribe_caller=1)) as ws:
        with trio.fail_after(5):
            error = await ws.get_message()
            with pytest.raises(ConnectionClosed) as closed:
                await ws.get_message()
    assert error[0] == 0x05 and "--transcribe" in error[1:].decode() and "transcribe_caller" in error[1:].decode()
    assert closed.value.reason.code == 1008


def _metric(text: str, name: str) -> float:
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


@pytest.mark.parametrize("head", [True, False])
async def test_the_quality_figures_from_the_models_end_of_turn_beside_the_vads(virtual_server, autojump_clock, head):
    handle = await virtual_server(_engine(head=head))
    seen, row = await _watched_call(handle)
    with trio.fail_after(10):  # (the histograms are observed once the session has ended)
        while _metric(await handle.metrics(), "pplex_talk_over_seconds_count") < 1:
            await trio.sleep(0.1)
    metrics = await handle.metrics()
    turn_figures = {"response_latency_turn_ms", "talk_over_turn_s"}
    if head:  # the echo says the caller's tone back over it: talk-over within the turn, and no answer after it
        assert turn_figures <= set(row["quality"]) and row["quality"]["talk_over_turn_s"] > 0
        assert _metric(metrics, "pplex_talk_over_turn_seconds_count") == 1
    else:  # the VAD's fallback turns: the VAD's own figures only
        assert not turn_figures & set(row["quality"])
        assert _metric(metrics, "pplex_talk_over_turn_seconds_count") == 0
    assert "pplex_response_latency_turn_seconds_count" in metrics
