"""Call records (``--record DIR``), on the virtual network and clock with the echo engine.

What a record holds is checked against what the client sent and received,
read back with the standard library's ``wave`` and ``json`` (not the
server's code): the caller's samples on the left, the agent's on the right,
the text pieces with the times of their frames.  A fake filesystem (the one
place the recorder opens a file, patched here) stands in for a full disk and
a disk that hangs.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import re
import threading
import time
import wave

import numpy as np
import pytest
import soxr
import trio
from trio_websocket import ConnectionClosed

from _helpers.live import PATH as LIVE_PATH
from _helpers.live import LiveClient
from _helpers.twilio import ACCOUNT_SID, CALL_SID, STREAM_SID, TwilioCall, float_to_ulaw
from _helpers.twilio import PATH as TWILIO_PATH
from _helpers.ws import FRAME, SR, moshi_handshake, moshi_url, opus_messages, raw_open, read_until_closed
from pplex_trio._cli import build_parser
from pplex_trio._cli._settings_cli import settings_from_args
from pplex_trio._conversation import Conversation, Outcome
from pplex_trio._metrics import Metrics
from pplex_trio.engine import OutputFrame
from pplex_trio.server import RecordFolderError, ServerSettings, prepare_record_folder
from pplex_trio.server.records._files import RecordFiles
from pplex_trio.server.records._recorder import MAX_QUEUED_FRAMES, CallEnding, Recorder

TOKEN = "records-token-5e7a1c"
PERSONA = "You answer the phone for a bakery."
VOICE = "NATF2.pt"
CALLER, AGENT = 0, 1


def speech_frames(path, seconds: float = 2.0, offset: float = 3.0) -> np.ndarray:
    """Real speech (16-bit, 24 kHz) as int16, whole frames of it."""
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SR, 1, 2)
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    start = int(offset * SR)
    return samples[start : start + int(seconds * SR) // FRAME * FRAME].copy()


def read_wav(path) -> tuple[np.ndarray, tuple[int, int, int]]:
    with wave.open(str(path)) as w:
        shape = (w.getframerate(), w.getnchannels(), w.getsampwidth())
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2), shape


def only_record(folder) -> str:
    ids = sorted({name.split(".", 1)[0] for name in os.listdir(folder)})
    assert len(ids) == 1, ids
    return ids[0]


async def until(predicate, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


async def say_and_close(ws, samples: np.ndarray) -> None:
    """Say int16 ``samples`` over the raw protocol at real-time pace, a frame a message, then close."""
    for i in range(0, samples.size, FRAME):
        await ws.send_message((samples[i : i + FRAME].astype(np.float32) / 32768).astype("<f4").tobytes())
        await trio.sleep(FRAME / SR)
    await ws.send_message(json.dumps({"type": "close"}))


async def raw_call(handle, samples: np.ndarray, **params) -> tuple[list[np.ndarray], list[str], list[int]]:
    """A raw conversation that says ``samples`` in real time, then closes: the frames it got, the text pieces, and
    for each piece the number of the frame it came after."""
    frames: list[np.ndarray] = []
    texts: list[str] = []
    text_frames: list[int] = []
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws, **params)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(say_and_close, ws, samples)
            while True:
                message = await ws.get_message()
                if isinstance(message, bytes):
                    frames.append(np.frombuffer(message, "<f4"))
                    continue
                event = json.loads(message)
                if event["type"] == "done":
                    break
                assert event["type"] == "text", event
                texts.append(event["text"])
                text_frames.append(len(frames) - 1)
        await read_until_closed(ws)
    return frames, texts, text_frames


# -- what a record holds ---------------------------------------------------------------------------------------


async def test_a_raw_call_is_recorded_exactly_as_it_was_heard_and_said(
    virtual_server, autojump_clock, tmp_path, speech_wav
):
    folder = tmp_path / "records"
    handle = await virtual_server(record_dir=folder)
    said = speech_frames(speech_wav)
    frames, texts, text_frames = await raw_call(handle, said, persona=PERSONA, voice=VOICE)
    await until(lambda: any(name.endswith(".json") for name in os.listdir(folder)))
    record_id = only_record(folder)
    assert re.fullmatch(r"\d{8}T\d{6}Z-s\d+-[0-9a-f]{6}", record_id)
    assert sorted(os.listdir(folder)) == [f"{record_id}.json", f"{record_id}.vtt", f"{record_id}.wav"]

    audio, shape = read_wav(folder / f"{record_id}.wav")
    assert shape == (24_000, 2, 2) and audio.shape[0] == len(frames) * FRAME
    # The agent's side is what the client received (float32 that came from 16-bit samples: exact).
    received = np.concatenate(frames)
    assert np.array_equal(audio[:, AGENT], (received * 32768).astype(np.int16))
    # The caller's side is what the client said, at its place on the timeline (a whole frame), silence around it.
    caller = audio[:, CALLER]
    start = int(np.flatnonzero(caller)[0]) // FRAME * FRAME
    assert np.array_equal(caller[start : start + said.size], said)
    assert not caller[:start].any() and not caller[start + said.size :].any()

    record = json.loads((folder / f"{record_id}.json").read_text())
    assert record["id"] == record_id and record["protocol"] == "raw"
    assert record["persona"] == PERSONA and record["voice"] == VOICE
    assert record["frames"] == len(frames) and record["seconds"] == pytest.approx(len(frames) * 0.08)
    assert record["sample_rate"] == 24_000 and record["channels"] == ["caller", "agent"]
    assert record["ending"] == "completed" and record["close_code"] == 1000
    assert record["complete"] is True and record["error"] is None and record["frames_lost"] == 0
    assert record["frames_sent"] == len(frames) and record["output_dropped"] == 0
    assert abs(time.time() - time.mktime(time.strptime(record["started"], "%Y-%m-%dT%H:%M:%SZ")) + time.timezone) < 60
    assert [(piece["t"], piece["text"]) for piece in record["text"]] == [
        (pytest.approx(k * 0.08), text) for k, text in zip(text_frames, texts)
    ]

    vtt = (folder / f"{record_id}.vtt").read_text().split("\n\n")
    assert vtt[0] == "WEBVTT"
    cues = [cue.split("\n") for cue in vtt[1:] if cue.strip()]
    assert [(cue[0].split(" --> ")[0], cue[1]) for cue in cues] == [
        (f"00:00:{k * 80 // 1000:02d}.{k * 80 % 1000:03d}", text.strip()) for k, text in zip(text_frames, texts)
    ]


def pcm16_event(kind: str, pcm: np.ndarray) -> str:
    data = (np.clip(pcm, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
    return json.dumps({"type": kind, "audio": base64.b64encode(data).decode()})


async def read_on(ws) -> None:
    with contextlib.suppress(ConnectionClosed):
        while True:
            await ws.get_message()


async def say(ws, messages: list, every: float) -> None:
    """Send ``messages`` one per ``every`` seconds while reading what comes back, then half a second more."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_on, ws)
        for message in messages:
            await ws.send_message(message)
            await trio.sleep(every)
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()


async def moshi_call(handle, pcm: np.ndarray) -> str:
    url = moshi_url(handle.ws_url, text_prompt=PERSONA, voice_prompt=VOICE)
    async with handle.open_websocket(url) as ws:
        await moshi_handshake(ws)
        await say(ws, [b"\x01" + page for frame in opus_messages(pcm) for page in frame], 0.04)
    return "client_closed"  # (the client left: its close is the end)


async def raw_call_ended_by_close(handle, pcm: np.ndarray) -> str:
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws, persona=PERSONA, voice=VOICE)
        await say(ws, [pcm[i : i + FRAME].astype("<f4").tobytes() for i in range(0, pcm.size, FRAME)], 0.08)
        await ws.send_message(json.dumps({"type": "close"}))
        await read_until_closed(ws)
    return "completed"


async def realtime_call(handle, pcm: np.ndarray) -> str:
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        await ws.send_message(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "instructions": PERSONA, "audio": {"output": {"voice": VOICE}}},
                }
            )
        )
        await say(
            ws,
            [pcm16_event("input_audio_buffer.append", pcm[i : i + FRAME // 2]) for i in range(0, pcm.size, FRAME // 2)],
            0.04,
        )
    return "client_closed"


async def live_call(handle, pcm: np.ndarray) -> str:
    async with handle.open_websocket(handle.ws_url + LIVE_PATH) as ws:
        client = LiveClient(ws)
        await client.start(instructions=PERSONA, audio={"output": {"voice": VOICE}})
        await say(
            ws,
            [
                pcm16_event("session.input_audio.append", pcm[i : i + FRAME // 2])
                for i in range(0, pcm.size, FRAME // 2)
            ],
            0.04,
        )
        await client.send("session.close")
        await client.until_closed()
    return "completed"


async def twilio_call(handle, pcm: np.ndarray) -> str:
    mulaw = float_to_ulaw(soxr.resample(pcm, SR, 8000).astype(np.float32))
    async with handle.open_websocket(handle.ws_url + TWILIO_PATH) as ws:
        call = TwilioCall(ws)
        await call.open(persona=PERSONA, voice=VOICE)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_on, ws)
            for i in range(0, len(mulaw), 160):
                await call.media(mulaw[i : i + 160])
                await trio.sleep(0.02)
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        await call.stop()
        with contextlib.suppress(ConnectionClosed):
            await call.until_closed()
    return "hangup"


CALLS = {
    "moshi": moshi_call,
    "raw": raw_call_ended_by_close,
    "realtime": realtime_call,
    "live": live_call,
    "twilio": twilio_call,
}


@pytest.mark.parametrize("protocol", sorted(CALLS))
async def test_every_protocol_gets_its_record(virtual_server, autojump_clock, tmp_path, speech_wav, protocol):
    folder = tmp_path / "records"
    handle = await virtual_server(record_dir=folder)
    pcm = speech_frames(speech_wav, seconds=1.5).astype(np.float32) / 32768
    ending = await CALLS[protocol](handle, pcm)
    await until(lambda: any(name.endswith(".json") for name in os.listdir(folder)))
    record_id = only_record(folder)
    record = json.loads((folder / f"{record_id}.json").read_text())
    assert record["protocol"] == protocol  # (a carrier's calls: the carrier's name)
    assert (record["persona"], record["voice"], record["ending"]) == (PERSONA, VOICE, ending)
    assert record["complete"] is True and record["frames"] >= 1.5 / 0.08 - 1
    audio, shape = read_wav(folder / f"{record_id}.wav")
    assert shape == (24_000, 2, 2) and audio.shape[0] == record["frames"] * FRAME
    assert np.abs(audio[:, CALLER]).max() > 1000 and np.abs(audio[:, AGENT]).max() > 1000  # speech both ways
    if protocol == "twilio":  # a carrier's call: its ids are kept too
        assert record["call"] == {"id": CALL_SID, "stream": STREAM_SID, "account": ACCOUNT_SID}
    listed = (await handle.get_json("/api/recordings"))["recordings"]
    assert [entry["id"] for entry in listed] == [record_id] and "text" not in listed[0]
    assert listed[0]["in_progress"] is False and listed[0]["protocol"] == record["protocol"]


# -- a client that stops reading -------------------------------------------------------------------------------


async def test_a_client_that_stalls_its_reading_gets_fewer_frames_but_the_record_has_every_one(
    virtual_server, autojump_clock, tmp_path, speech_wav
):
    folder = tmp_path / "records"
    handle = await virtual_server(record_dir=folder, output_backlog_seconds=0.4)
    said = speech_frames(speech_wav, seconds=4.0)
    received = 0
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex", receive_buffer=16 * 1024) as ws:
        await raw_open(ws)
        start = trio.current_time()

        async def read() -> None:
            nonlocal received
            while True:
                message = await ws.get_message()
                if isinstance(message, bytes):
                    received += 1
                elif json.loads(message)["type"] == "done":
                    return

        async def network() -> None:  # what the client receives is held on its way for 2 s
            await trio.sleep_until(start + 1.0)
            ws._stream.stall(sending=False)
            await trio.sleep(2.0)
            ws._stream.unstall()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(network)
            nursery.start_soon(read)
            for i in range(0, said.size, FRAME):
                await ws.send_message((said[i : i + FRAME].astype(np.float32) / 32768).astype("<f4").tobytes())
                await trio.sleep(FRAME / SR)
            await ws.send_message(json.dumps({"type": "close"}))
        await read_until_closed(ws)
    await until(lambda: any(name.endswith(".json") for name in os.listdir(folder)))
    record_id = only_record(folder)
    record = json.loads((folder / f"{record_id}.json").read_text())
    audio, _ = read_wav(folder / f"{record_id}.wav")
    frames = said.size // FRAME
    assert received < frames and record["frames_sent"] == received
    assert record["output_dropped"] + record["output_skipped"] == frames - received
    # Every frame is in the record: the caller's whole, and the echo of each (one frame later) on the right.
    assert record["frames"] == frames and audio.shape[0] == frames * FRAME
    caller, agent = audio[:, CALLER], audio[:, AGENT]
    assert np.array_equal(caller, said)
    assert not agent[:FRAME].any() and np.array_equal(agent[FRAME:], said[:-FRAME])


# -- retention, quota, deletion ----------------------------------------------------------------------------------

DAY = 86_400


def old_record(folder, n: int, *, days: float, size: int = 1000) -> str:
    """A finished record as an earlier server left it, last written ``days`` ago."""
    folder.mkdir(parents=True, exist_ok=True)
    record_id = f"20261101T1200{n:02d}Z-s{n}-abcdef"
    (folder / f"{record_id}.wav").write_bytes(bytes(size))
    (folder / f"{record_id}.vtt").write_text("WEBVTT\n")
    (folder / f"{record_id}.json").write_text(
        json.dumps({"id": record_id, "started": f"2026-11-01T12:00:{n:02d}Z", "protocol": "raw", "complete": True})
    )
    when = time.time() - days * DAY
    for suffix in (".wav", ".vtt", ".json"):
        os.utime(folder / f"{record_id}{suffix}", (when, when))
    return record_id


def ids_in(folder) -> set[str]:
    return {name.split(".", 1)[0] for name in os.listdir(folder) if re.match(r"\d{8}T", name)}


async def test_records_past_retention_are_deleted_at_start_and_after_each_call(
    virtual_server, autojump_clock, tmp_path, speech_wav
):
    folder = tmp_path / "records"
    stale, fresh = old_record(folder, 1, days=8), old_record(folder, 2, days=6)
    (folder / "notes.txt").write_text("the operator's own file")
    os.utime(folder / "notes.txt", (0, 0))
    handle = await virtual_server(record_dir=folder, record_retention_days=7)
    assert ids_in(folder) == {fresh} and (folder / "notes.txt").exists()  # (what is not a record is left alone)
    when = time.time() - 8 * DAY  # a week has passed for the other one
    for suffix in (".wav", ".vtt", ".json"):
        os.utime(folder / f"{fresh}{suffix}", (when, when))
    await raw_call(handle, speech_frames(speech_wav, seconds=0.5))
    await until(lambda: fresh not in ids_in(folder))
    assert len(ids_in(folder)) == 1 and stale not in ids_in(folder)
    assert 'pplex_records_deleted_total{reason="retention"} 2.0' in await handle.metrics()


async def test_beyond_the_quota_the_oldest_go_first_never_a_call_in_progress(
    virtual_server, autojump_clock, tmp_path, speech_wav
):
    folder = tmp_path / "records"
    oldest, older, old = (old_record(folder, n, days=3 - n, size=100_000) for n in range(3))
    # 250 kB: the three (300 kB) are too many, and a second of a call is 96 kB.
    handle = await virtual_server(record_dir=folder, record_quota_gib=250_000 / 2**30)
    assert ids_in(folder) == {older, old}
    said = speech_frames(speech_wav, seconds=3.0)
    long_call_done = trio.Event()

    async def long_call() -> None:
        await raw_call(handle, said)
        long_call_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(long_call)
        await trio.sleep(2.0)  # ~190 kB of it written
        [in_progress] = ids_in(folder) - {older, old}
        await raw_call(handle, said[: said.size // 6 // FRAME * FRAME])  # a short call ends meanwhile
        [short] = ids_in(folder) - {older, old, in_progress}
        await until(lambda: older not in ids_in(folder) and old not in ids_in(folder))
        listed = (await handle.get_json("/api/recordings"))["recordings"]
        assert ids_in(folder) == {in_progress, short}  # 2 s of the call in progress, and the short one: 250 kB
        assert [(entry["id"], entry["in_progress"]) for entry in listed] == [(short, False), (in_progress, True)]
        await long_call_done.wait()
    # Once over, the long call's 3 s (288 kB) is beyond the quota on its own: the short one goes, then it.
    await until(lambda: not ids_in(folder))
    assert 'pplex_records_deleted_total{reason="quota"} 5.0' in await handle.metrics()


async def test_a_record_is_deleted_on_request_but_not_while_its_call_goes_on(
    virtual_server, autojump_clock, tmp_path, speech_wav
):
    folder = tmp_path / "records"
    handle = await virtual_server(record_dir=folder)
    said = speech_frames(speech_wav, seconds=2.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(raw_call, handle, said)
        await trio.sleep(1.5)
        [record_id] = ids_in(folder)
        async with handle.http() as http:
            assert (await http.delete(f"/api/recordings/{record_id}")).status_code == 409
            assert (await http.get(f"/api/recordings/{record_id}/audio")).status_code == 409
            assert (await http.get(f"/api/recordings/{record_id}")).json()["in_progress"] is True
    await until(lambda: (folder / f"{record_id}.json").exists())
    async with handle.http() as http:
        record = (await http.get(f"/api/recordings/{record_id}")).json()
        assert record["id"] == record_id and record["in_progress"] is False and record["text"]
        audio = await http.get(f"/api/recordings/{record_id}/audio")
        assert audio.status_code == 200 and audio.headers["content-type"] == "audio/wav"
        assert audio.content == (folder / f"{record_id}.wav").read_bytes()
        assert audio.headers["cache-control"] == "no-store"
        text = await http.get(f"/api/recordings/{record_id}/text")
        assert text.headers["content-type"].startswith("text/vtt") and text.text.startswith("WEBVTT")
        deleted = await http.delete(f"/api/recordings/{record_id}")
        assert deleted.status_code == 204 and not os.listdir(folder)
        assert (await http.get(f"/api/recordings/{record_id}")).status_code == 404
        assert (await http.get(f"/api/recordings/{record_id}/audio")).status_code == 404
        assert (await http.delete(f"/api/recordings/{record_id}")).status_code == 404
        assert (await http.get("/api/recordings")).json() == {"recordings": []}
    assert 'pplex_records_deleted_total{reason="request"} 1.0' in await handle.metrics()


@pytest.mark.parametrize(
    "bad",
    [
        "..%2F..%2Foutside",
        "..%2Foutside.json",
        "%2E%2E",
        "x" * 5000,
        "20261101T120001Z-s1-abcdef.json",
        "20261101T120001Z-s1-ABCDEF",
        "20261101T120001Z-s1-abcdef%00",
    ],
)
async def test_an_id_that_is_not_a_records_is_404_and_touches_nothing(virtual_server, autojump_clock, tmp_path, bad):
    folder = tmp_path / "deep" / "records"
    kept = old_record(folder, 1, days=0)
    (tmp_path / "deep" / "outside.json").write_text("{}")
    (tmp_path / "deep" / "outside.wav").write_text("")
    handle = await virtual_server(record_dir=folder)
    async with handle.http() as http:
        for path in (f"/api/recordings/{bad}", f"/api/recordings/{bad}/audio", f"/api/recordings/{bad}/text"):
            response = await http.get(path)
            assert response.status_code == 404 and "outside" not in response.text, path
        assert (await http.delete(f"/api/recordings/{bad}")).status_code in (404, 405)
    assert ids_in(folder) == {kept} and sorted(os.listdir(tmp_path / "deep")) == [
        "outside.json",
        "outside.wav",
        "records",
    ]


async def test_the_records_need_the_token(virtual_server, autojump_clock, tmp_path):
    folder = tmp_path / "records"
    record_id = old_record(folder, 1, days=0)
    handle = await virtual_server(record_dir=folder, auth_token=TOKEN)
    async with handle.http() as http:
        for path in (
            "/api/recordings",
            f"/api/recordings/{record_id}",
            f"/api/recordings/{record_id}/audio",
            f"/api/recordings/{record_id}/text",
        ):
            assert (await http.get(path)).status_code == 401, path
            assert (await http.get(path, headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 200, path
        assert (await http.delete(f"/api/recordings/{record_id}")).status_code == 401
        assert ids_in(folder) == {record_id}
        assert (
            await http.delete(f"/api/recordings/{record_id}", headers={"Authorization": f"Bearer {TOKEN}"})
        ).status_code == 204


async def test_with_recording_off_the_routes_say_how_to_turn_it_on(virtual_server, autojump_clock, speech_wav):
    handle = await virtual_server()
    await raw_call(handle, speech_frames(speech_wav, seconds=0.5))
    async with handle.http() as http:
        for method, path in (
            ("GET", "/api/recordings"),
            ("GET", "/api/recordings/20261101T120001Z-s1-abcdef"),
            ("GET", "/api/recordings/20261101T120001Z-s1-abcdef/audio"),
            ("DELETE", "/api/recordings/20261101T120001Z-s1-abcdef"),
        ):
            response = await http.request(method, path)
            assert response.status_code == 404 and "--record DIR" in response.json()["error"], path


async def test_a_disk_that_falls_behind_loses_the_oldest_frames_and_a_gap_stays_silent(tmp_path):
    """The recorder alone (no writer task: a disk that has not answered for 40 s): 500 frames wait, the oldest
    beyond 30 s are lost and counted; ticks the conversation was not stepped in (its prompt running again) are
    silence; the WAV stays on the timeline."""
    done = []
    metrics = Metrics()
    recorder = Recorder(
        "20261205T220102Z-s1-abcdef",
        tmp_path,
        protocol="raw",
        conversation=Conversation(),
        limiter=trio.CapacityLimiter(1),
        metrics=metrics,
        on_done=done.append,
    )
    ticks = [*range(100, 400), *range(420, 620)]  # 20 ticks without it at 400-419
    for n, tick in enumerate(ticks):
        level = (n % 100 + 1) / 128
        recorder.on_frame(
            OutputFrame(np.full(FRAME, -level, np.float32), f" {tick}", tick, heard=np.full(FRAME, level, np.float32))
        )
    await recorder.finish(CallEnding(Outcome.COMPLETED, 1000, Conversation(), {}))
    assert done == [recorder]
    lost = len(ticks) - MAX_QUEUED_FRAMES
    audio, _ = read_wav(tmp_path / f"{recorder.id}.wav")
    assert audio.shape[0] == 520 * FRAME
    levels = audio[::FRAME, CALLER]
    assert not levels[:lost].any() and not levels[300:320].any()  # the lost frames, and the gap
    expected = [int((n % 100 + 1) / 128 * 32768) for n in range(len(ticks))]
    assert list(levels[lost:300]) == expected[lost:300] and list(levels[320:]) == expected[300:]
    assert np.array_equal(audio[:, AGENT], -audio[:, CALLER])
    record = json.loads((tmp_path / f"{recorder.id}.json").read_text())
    assert record["frames_lost"] == lost and record["frames"] == 520 and record["complete"] is True
    assert [piece["text"] for piece in record["text"]] == [f" {tick}" for tick in ticks]  # (text is never lost)
    assert record["text"][-1]["t"] == pytest.approx(519 * 0.08)
    assert f"pplex_record_frames_lost_total {float(lost)}" in metrics.render().decode()


# -- a disk that fails ----------------------------------------------------------------------------------------


class FakeDisk:
    """Stands in for the filesystem where the recorder opens its files: a write that would pass ``room`` bytes
    (of the files ``failing`` picks) fails with ``error``; one of a file ``hanging`` picks waits for ``release``."""

    def __init__(
        self, room: int = 1 << 40, error: int = errno.ENOSPC, failing=lambda path: True, hanging=lambda path: False
    ):
        self.room, self.error, self.failing, self.hanging = room, error, failing, hanging
        self.release = threading.Event()
        self.hung = threading.Event()

    def open(self, path):
        return FakeFile(open(path, "wb"), self, self.failing(path), self.hanging(path))


class FakeFile:
    def __init__(self, file, disk: FakeDisk, failing: bool, hanging: bool):
        self._file, self._disk, self._failing, self._hanging = file, disk, failing, hanging

    def write(self, data) -> int:
        if self._hanging:
            self._disk.hung.set()
            assert self._disk.release.wait(20), "the test never released the hung disk"
        if self._failing:
            if len(data) > self._disk.room:
                self._disk.room = 0  # (full: nothing fits any more)
                raise OSError(self._disk.error, os.strerror(self._disk.error))
            self._disk.room -= len(data)
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


def lateness(arrivals: list[float]) -> float:
    """How far behind the 80 ms grid of the first frame the latest frame arrived."""
    return max(at - (arrivals[0] + k * FRAME / SR) for k, at in enumerate(arrivals))


async def timed_raw_call(handle, samples: np.ndarray) -> list[float]:
    """A raw conversation that says ``samples`` and closes; when each of its frames arrived."""
    arrivals: list[float] = []
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(say_and_close, ws, samples)
            while not isinstance(message := await ws.get_message(), str) or json.loads(message)["type"] != "done":
                if isinstance(message, bytes):
                    arrivals.append(trio.current_time())
        await read_until_closed(ws)
    return arrivals


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO])
async def test_a_disk_that_fails_loses_the_record_never_the_call(
    virtual_server, autojump_clock, tmp_path, caplog, monkeypatch, speech_wav, error
):
    """A full disk (every write fails once 150 kB are written) loses the whole record; an I/O error in the audio
    alone leaves a JSON that says so.  Either way the call goes on to its end, on time, and one line says why."""
    caplog.set_level(logging.INFO, logger="pplex_trio")
    disk = FakeDisk(
        room=150_000,
        error=error,
        failing=(lambda path: True) if error == errno.ENOSPC else (lambda path: path.suffix == ".wav"),
    )
    monkeypatch.setattr(RecordFiles, "_open", staticmethod(disk.open))
    folder = tmp_path / "records"
    handle = await virtual_server(record_dir=folder)
    said = speech_frames(speech_wav, seconds=4.0)
    arrivals = await timed_raw_call(handle, said)
    assert len(arrivals) == said.size // FRAME and lateness(arrivals) < 0.01
    await until(lambda: not handle.server.records._recording)
    warnings = [r for r in caplog.records if "call record" in r.getMessage() and r.levelno >= logging.WARNING]
    reason = os.strerror(error)
    assert [r.getMessage().split(": ", 1)[1] for r in warnings] == [
        f"cannot write ({reason}); the call goes on unrecorded"
    ]
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text
    metrics = await handle.metrics()
    assert "pplex_records_failed_total 1.0" in metrics and "pplex_records_written_total 0.0" in metrics
    if error == errno.ENOSPC:
        assert not os.listdir(folder)  # not even its JSON fitted: nothing is kept
    else:
        [record_id] = ids_in(folder)
        record = json.loads((folder / f"{record_id}.json").read_text())
        assert record["complete"] is False and record["error"] == reason and record["frames"] == len(arrivals)
        listed = (await handle.get_json("/api/recordings"))["recordings"]
        assert listed[0]["complete"] is False


async def test_a_hung_disk_holds_neither_the_other_calls_nor_the_end_of_its_own(
    virtual_server, autojump_clock, tmp_path, caplog, monkeypatch, speech_wav
):
    """The first call's audio file hangs on its first write (a disk that stopped answering), on a real thread;
    a second call at the same time keeps its frames on time and its record; the first ends on time, its session
    is gone within the recorder's 5 s, and it holds one of the records' threads, not two.  (The second call's
    writes run inline, as the fixture runs threads: a real thread would let the virtual clock run past its
    deadline while it worked.)"""
    hung_files: list[RecordFiles] = []  # the first record to be written: on a real thread, and its audio hangs
    disk = FakeDisk(hanging=lambda path: path == hung_files[0].wav_path)
    monkeypatch.setattr(RecordFiles, "_open", staticmethod(disk.open))
    folder = tmp_path / "records"
    handle = await virtual_server(record_dir=folder)
    inline = trio.to_thread.run_sync

    async def threads(fn, *args, **options):  # the first record's work on real threads, the rest inline
        files = getattr(fn, "__self__", None)
        if isinstance(files, RecordFiles) and not hung_files:
            hung_files.append(files)
        run = REAL_RUN_SYNC if hung_files and files is hung_files[0] else inline
        return await run(fn, *args, **options)

    monkeypatch.setattr(trio.to_thread, "run_sync", threads)
    said = speech_frames(speech_wav, seconds=3.0)
    timings: dict[str, list[float]] = {}
    ended: dict[str, float] = {}

    async def call(name: str) -> None:
        timings[name] = await timed_raw_call(handle, said)
        ended[name] = trio.current_time()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "first")
            await trio.sleep(0.2)
            nursery.start_soon(call, "second")
        assert disk.hung.is_set()
        for name in ("first", "second"):
            assert len(timings[name]) == said.size // FRAME and lateness(timings[name]) < 0.01, name
        await until(lambda: not handle.server.sessions and not handle.server.records._recording)
        assert trio.current_time() - ended["first"] <= 5.5
        assert handle.server.records.limiter.borrowed_tokens == 1  # (the stuck write's; its end took none)
        assert "pplex_records_failed_total 1.0" in await handle.metrics()
        first = hung_files[0].wav_path.stem
        [second] = ids_in(folder) - {first}
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
            f"call record {first}: cannot write (the disk did not answer within 5 s); the call goes on unrecorded"
        ]
        assert json.loads((folder / f"{second}.json").read_text())["complete"] is True
    finally:
        disk.release.set()
    # Once the disk answers, the first record is closed all the same (by a thread of its own), and says so.
    deadline = time.monotonic() + 10
    while not (folder / f"{first}.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    record = json.loads((folder / f"{first}.json").read_text())
    assert record["complete"] is False and record["error"] == "the disk did not answer within 5 s"


REAL_RUN_SYNC = trio.to_thread.run_sync


# -- the settings ------------------------------------------------------------------------------------------------


def test_the_record_flags_parse_and_a_folder_that_cannot_be_used_is_said_at_start(tmp_path):
    args = build_parser().parse_args(
        ["serve", "--record", str(tmp_path / "r"), "--record-retention", "7", "--record-quota", "1GiB"]
    )
    settings = settings_from_args(ServerSettings, args)
    assert settings.record_dir == tmp_path / "r" and settings.record_retention_days == 7
    assert settings.record_quota == 2**30
    assert parse("--record-quota", "512MiB").record_quota == 512 * 2**20
    defaults = ServerSettings()
    assert defaults.record_dir is None and defaults.record_retention_days == 30 and defaults.record_quota == 10 * 2**30
    config = tmp_path / "serve.toml"
    config.write_text(f'record = "{tmp_path / "r"}"\nrecord-retention = 0\nrecord-quota = "0"\n')
    settings = parse("--config", str(config))
    assert (settings.record_dir, settings.record_retention_days, settings.record_quota) == (tmp_path / "r", 0, 0)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(RecordFolderError, match=r"--record .*a-file/records: cannot create the folder"):
        prepare_record_folder(tmp_path / "a-file" / "records")
    with pytest.raises(ValueError, match="--record-retention must be at least 0"):
        ServerSettings(record_retention_days=-1)


def parse(*args: str) -> ServerSettings:
    return settings_from_args(ServerSettings, build_parser().parse_args(["serve", *args]))
