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

from pplex_trio.server import ServerSettings
from pplex_trio.server._recorder import RecordFiles

from _helpers.live import PATH as LIVE_PATH
from _helpers.live import LiveClient
from _helpers.twilio import PATH as TWILIO_PATH
from _helpers.twilio import TwilioCall, float_to_ulaw
from _helpers.ws import FRAME, SR, moshi_handshake, moshi_url, opus_messages, raw_open, read_until_closed

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
    return samples[start:start + int(seconds * SR) // FRAME * FRAME].copy()


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


async def raw_call(handle, samples: np.ndarray, **params) -> tuple[list[np.ndarray], list[str], list[int]]:
    """A raw conversation that says ``samples`` in real time, then closes: the frames it got, the text pieces, and
    for each piece the number of the frame it came after."""
    frames: list[np.ndarray] = []
    texts: list[str] = []
    text_frames: list[int] = []
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws, **params)

        async def talk() -> None:
            for i in range(0, samples.size, FRAME):
                await ws.send_message((samples[i:i + FRAME].astype(np.float32) / 32768).astype("<f4").tobytes())
                await trio.sleep(FRAME / SR)
            await ws.send_message(json.dumps({"type": "close"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(talk)
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


async def test_a_raw_call_is_recorded_exactly_as_it_was_heard_and_said(virtual_server, autojump_clock, tmp_path,
                                                                      speech_wav):
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
    assert np.array_equal(caller[start:start + said.size], said)
    assert not caller[:start].any() and not caller[start + said.size:].any()

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
        (pytest.approx(k * 0.08), text) for k, text in zip(text_frames, texts)]

    vtt = (folder / f"{record_id}.vtt").read_text().split("\n\n")
    assert vtt[0] == "WEBVTT"
    cues = [cue.split("\n") for cue in vtt[1:] if cue.strip()]
    assert [(cue[0].split(" --> ")[0], cue[1]) for cue in cues] == [
        (f"00:00:{k * 80 // 1000:02d}.{k * 80 % 1000:03d}", text.strip()) for k, text in zip(text_frames, texts)]


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
        await say(ws, [pcm[i:i + FRAME].astype("<f4").tobytes() for i in range(0, pcm.size, FRAME)], 0.08)
        await ws.send_message(json.dumps({"type": "close"}))
        await read_until_closed(ws)
    return "completed"


async def realtime_call(handle, pcm: np.ndarray) -> str:
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:
        assert json.loads(await ws.get_message())["type"] == "session.created"
        await ws.send_message(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "instructions": PERSONA, "audio": {"output": {"voice": VOICE}}}}))
        await say(ws, [pcm16_event("input_audio_buffer.append", pcm[i:i + FRAME // 2])
                       for i in range(0, pcm.size, FRAME // 2)], 0.04)
    return "client_closed"


async def live_call(handle, pcm: np.ndarray) -> str:
    async with handle.open_websocket(handle.ws_url + LIVE_PATH) as ws:
        client = LiveClient(ws)
        await client.start(instructions=PERSONA, audio={"output": {"voice": VOICE}})
        await say(ws, [pcm16_event("session.input_audio.append", pcm[i:i + FRAME // 2])
                       for i in range(0, pcm.size, FRAME // 2)], 0.04)
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
                await call.media(mulaw[i:i + 160])
                await trio.sleep(0.02)
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        await call.stop()
        with contextlib.suppress(ConnectionClosed):
            await call.until_closed()
    return "hangup"


CALLS = {"moshi": moshi_call, "raw": raw_call_ended_by_close, "realtime": realtime_call, "live": live_call,
         "twilio": twilio_call}


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
    listed = (await handle.get_json("/api/recordings"))["recordings"]
    assert [entry["id"] for entry in listed] == [record_id] and "text" not in listed[0]
    assert listed[0]["in_progress"] is False and listed[0]["protocol"] == record["protocol"]
