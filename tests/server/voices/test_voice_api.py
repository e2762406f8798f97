"""The voice API on the real server (echo engine): adding, listing, using, deleting, and every bad upload.

Each bad upload is checked for its status, its message, and that it left
nothing behind: no voice, no half-written file, and a conversation streaming
beside it (a :class:`RawWitness`) lost not a frame.  The virtual network and
clock: the witness streams in exact time, whatever the machine's load.
"""

from __future__ import annotations

import json
import logging
import struct

import httpx
import numpy as np
import pytest
import sphn
import trio

from _helpers.ws import raw_open, read_until_closed
from pplex_trio.server.voices._store import VoiceLimits

RATE = 24_000
FRAME_SECONDS = 0.08  # one frame of a conversation


def wav_bytes(seconds: float, rate: int = RATE, level: float = 0.2, channels: int = 1) -> bytes:
    """A WAV clip of a warbling tone (any sound with loudness will do for the echo engine)."""
    t = np.arange(int(seconds * rate)) / rate
    tone = (level * np.sin(2 * np.pi * 200 * t * (1 + 0.1 * np.sin(2 * np.pi * 2 * t)))).astype(np.float32)
    pcm16 = (np.clip(np.tile(tone[:, None], (1, channels)), -1, 1) * 32767).astype("<i2").tobytes()
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(pcm16),
        b"WAVE",
        b"fmt ",
        16,
        1,
        channels,
        rate,
        rate * 2 * channels,
        2 * channels,
        16,
        b"data",
        len(pcm16),
    )
    return header + pcm16


def with_limits(handle, **limits):
    """The server's voice store, held to ``limits`` instead of the defaults (the routes read them per request)."""
    handle.server.voice_store.limits = VoiceLimits(**limits)
    return handle


def store_files(handle) -> list[str]:
    folder = handle.server.voice_store.folder
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


async def upload(
    handle, name: str | None, body: bytes, content_type: str | None = "audio/wav", **headers: str
) -> httpx.Response:
    params = {} if name is None else {"name": name}
    if content_type is not None:
        headers["content-type"] = content_type
    async with handle.http(timeout=30) as client:
        return await client.post("/api/voices", params=params, content=body, headers=headers)


async def read_answer(stream: trio.abc.Stream, timeout: float = 5.0) -> bytes:
    """One whole HTTP answer (head and its Content-Length body) from a raw socket."""
    data = b""
    with trio.fail_after(timeout):
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
            data.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]
        ):
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            data += chunk
    return data


async def voices(handle) -> dict:
    return (await handle.get("/api/voices")).json()


async def test_a_voice_is_added_listed_used_and_deleted(virtual_server, autojump_clock):
    handle = await virtual_server()
    response = await upload(handle, "MyVoice", wav_bytes(3.0))
    assert response.status_code == 201, response.text
    assert response.json() == {"voice": "MyVoice.pt", "seconds": 3.0}
    listed = await voices(handle)
    assert listed["added"] == ["MyVoice.pt"] and listed["voices"][-1] == "MyVoice.pt" and listed["uploads"] is True
    assert "NATF0.pt" in listed["voices"] and "NATF0.pt" not in listed["added"]
    assert store_files(handle) == ["MyVoice.pt"]

    async with handle.open_websocket(f"{handle.ws_url}/v1/audio/duplex") as ws:
        await raw_open(ws, voice_prompt="MyVoice.pt")  # ready: the conversation took the added voice
    assert handle.server.engine.started[-1][1].voice == "MyVoice.pt"

    async with handle.http() as client:
        gone = await client.delete("/api/voices/MyVoice")
        assert gone.status_code == 200 and gone.json() == {"deleted": "MyVoice.pt"}
        again = await client.delete("/api/voices/MyVoice")
        assert again.status_code == 404 and "no added voice" in again.json()["error"]
        own = await client.delete("/api/voices/NATF0.pt")
        assert own.status_code == 409 and "model's own voices" in own.json()["error"]
    assert (await voices(handle))["added"] == [] and store_files(handle) == []
    async with handle.open_websocket(f"{handle.ws_url}/v1/audio/duplex") as ws:
        await ws.send_message(json.dumps({"type": "open", "voice_prompt": "MyVoice.pt"}))
        closed = await read_until_closed(ws)
    assert closed.code == 1008 and "unknown voice_prompt 'MyVoice.pt'" in closed.reason


async def test_added_voices_survive_a_restart(virtual_server, autojump_clock, tmp_path):
    store = tmp_path / "kept"
    first = await virtual_server(voice_store=store)
    assert (await upload(first, "Kept", wav_bytes(2.0))).status_code == 201
    await first.shutdown()
    second = await virtual_server(voice_store=store)
    assert (await voices(second))["added"] == ["Kept.pt"]


def _lying_wav() -> bytes:
    data = wav_bytes(2.0)
    return data[:40] + struct.pack("<I", 100 * RATE * 2) + data[44:]  # its header claims 100 s


def _ogg_with_garbage() -> bytes:
    return b"OggS" + bytes(range(256)) * 64


# (name, body, content type, status, words in the message)
BAD_UPLOADS = [
    ("no-name", None, wav_bytes(2.0), "audio/wav", 400, "name the voice"),
    ("path-name", "../etc", wav_bytes(2.0), "audio/wav", 400, "1 to 48 letters"),
    ("long-name", "x" * 49, wav_bytes(2.0), "audio/wav", 400, "1 to 48 letters"),
    ("spaces", "my voice", wav_bytes(2.0), "audio/wav", 400, "1 to 48 letters"),
    ("model-voice", "NATF0", wav_bytes(2.0), "audio/wav", 409, "model's own voices"),
    ("text-type", "Clip", wav_bytes(2.0), "text/plain", 415, "Content-Type audio/wav"),
    ("no-type", "Clip", wav_bytes(2.0), None, 415, "Content-Type audio/wav"),
    ("webm", "Clip", b"\x1aE\xdf\xa3" + bytes(500), "audio/webm", 415, "audio/webm"),
    ("empty", "Clip", b"", "audio/wav", 400, "body is empty"),
    ("garbage", "Clip", bytes(range(256)) * 100, "audio/wav", 422, "not a recording this server can read"),
    ("garbage-ogg", "Clip", _ogg_with_garbage(), "audio/ogg", 422, "not a recording this server can read"),
    ("truncated", "Clip", wav_bytes(2.0)[:44], "audio/wav", 422, "no audio"),
    ("silent", "Clip", wav_bytes(2.0, level=0.0), "audio/wav", 422, "silent"),
    ("too-short", "Clip", wav_bytes(0.5), "audio/wav", 422, "at least 1 s"),
    ("too-long", "Clip", wav_bytes(31.0, rate=8_000), "audio/wav", 422, "longer than 30 s"),
    ("rate", "Clip", wav_bytes(2.0, rate=96_000), "audio/wav", 422, "96000 Hz"),
]


async def test_every_bad_upload_gets_its_answer_and_harms_nothing(virtual_server, autojump_clock, caplog):
    handle = with_limits(await virtual_server(), per_minute=1000)
    witness = handle.witness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(witness.run)
        await witness.ready.wait()
        for case, name, body, kind, status, words in BAD_UPLOADS:
            response = await upload(handle, name, body, kind)
            assert response.status_code == status, (case, response.text)
            assert words in response.json()["error"], (case, response.json())
            assert response.headers["content-type"] == "application/json"
            assert store_files(handle) == [], case
            assert "pplex-voice" not in response.text and "/tmp" not in response.text  # no path of the server
            await trio.sleep(FRAME_SECONDS)  # one upload per frame of the witness: it talks throughout
        # A clip whose header lies about its length is malformed: refused as such.
        lying = await upload(handle, "Lying", _lying_wav())
        assert lying.status_code == 422 and "malformed stream" in lying.json()["error"]
        witness.stop.set()
    witness.check()
    assert (await voices(handle))["added"] == [] and store_files(handle) == []
    assert "Traceback" not in caplog.text
    metrics = handle.server.metrics.voice_uploads
    assert metrics.labels("422")._value.get() == 8 and metrics.labels("added")._value.get() == 0


async def test_a_declared_length_over_the_limit_is_refused_before_the_body(virtual_server, autojump_clock):
    handle = await virtual_server()
    stream = await handle.connect()
    head = (
        f"POST /api/voices?name=Big HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\n"
        f"Content-Length: {50 * 2**20}\r\n\r\n"
    ).encode()
    await stream.send_all(head)
    answer = await read_answer(stream)
    assert answer.startswith(b"HTTP/1.1 413") and b"over 10 MiB" in answer
    await stream.aclose()


async def test_a_body_without_its_length_is_refused(virtual_server, autojump_clock):
    """A chunked body has no length to check before reading: the transport refuses it (411) at the head."""
    handle = await virtual_server()
    stream = await handle.connect()
    await stream.send_all(
        b"POST /api/voices?name=Big HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    answer = await read_answer(stream)
    assert answer.startswith(b"HTTP/1.1 411 Length Required")
    await stream.aclose()
    assert store_files(handle) == []


async def test_a_body_that_never_finishes_is_cut_off(virtual_server, autojump_clock, caplog):
    handle = with_limits(await virtual_server(), body_seconds=0.5)
    witness = handle.witness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(witness.run)
        await witness.ready.wait()
        stream = await handle.connect()
        body = wav_bytes(2.0)
        await stream.send_all(
            b"POST /api/voices?name=Slow HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:1000]
        )
        answer = await read_answer(stream)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in answer
        await stream.aclose()
        # One that vanishes mid-body: nobody to answer, nothing kept.
        stream = await handle.connect()
        await stream.send_all(
            b"POST /api/voices?name=Gone HTTP/1.1\r\nHost: x\r\nContent-Type: audio/wav\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:1000]
        )
        await trio.sleep(0.1)
        await stream.aclose()
        await trio.sleep(0.3)
        witness.stop.set()
    witness.check()
    assert store_files(handle) == [] and (await voices(handle))["added"] == []
    assert "Traceback" not in caplog.text
    # The name held by the upload that vanished is free again.
    assert (await upload(handle, "Gone", wav_bytes(2.0))).status_code == 201


async def test_limits_of_the_store_and_of_each_address(virtual_server, autojump_clock):
    handle = with_limits(await virtual_server(), max_voices=2, per_minute=4)
    assert (await upload(handle, "One", wav_bytes(1.5))).status_code == 201
    taken = await upload(handle, "One", wav_bytes(1.5))
    assert taken.status_code == 409 and "already a voice One.pt" in taken.json()["error"]
    assert (await upload(handle, "Two", wav_bytes(1.5))).status_code == 201
    full = await upload(handle, "Three", wav_bytes(1.5))
    assert full.status_code == 507 and "full (2 voices)" in full.json()["error"]
    limited = await upload(handle, "Four", wav_bytes(1.5))
    assert limited.status_code == 429 and "at most 4 voice uploads a minute" in limited.json()["error"]
    assert int(limited.headers["retry-after"]) > 0
    assert (await voices(handle))["added"] == ["One.pt", "Two.pt"]


async def test_a_hundred_uploads_at_once_each_get_a_clear_answer(virtual_server, autojump_clock, caplog):
    # Each 80 ms of a clip costs the engine 10 ms (a 1.5 s clip: 0.19 s), so the voices are made over several
    # ticks of the witness's conversation, and all hundred uploads arrive while the first four are being made.
    from pplex_trio.engine import EchoEngine

    engine = EchoEngine(2, delay_frames=1, prefill_steps=2, prefill_seconds=0.01)
    handle = with_limits(await virtual_server(engine), per_minute=1000, at_once=4)
    witness = handle.witness()
    answers = {}
    body = wav_bytes(1.5)

    async def one(client, i):
        answers[i] = await client.post(
            "/api/voices", params={"name": f"V{i}"}, content=body, headers={"content-type": "audio/wav"}
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(witness.run)
        await witness.ready.wait()
        async with handle.http(timeout=30) as client, trio.open_nursery() as uploads:
            for i in range(100):
                uploads.start_soon(one, client, i)
        witness.stop.set()
    witness.check()
    statuses = [answers[i].status_code for i in range(100)]
    assert set(statuses) == {201, 429} and statuses.count(201) == 4  # the four that came first, and only they
    busy = [answers[i].json()["error"] for i in range(100) if statuses[i] == 429]
    assert all("being added now" in message for message in busy)
    added = sorted(f"V{i}.pt" for i in range(100) if statuses[i] == 201)
    assert (await voices(handle))["added"] == sorted(added) and store_files(handle) == sorted(added)
    assert "Traceback" not in caplog.text


async def test_uploads_are_off_beyond_loopback_unless_allowed_and_need_the_token(virtual_server, autojump_clock):
    # auto on a server listening on every address: off (the store still lists what it keeps).
    handle = await virtual_server(host="0.0.0.0")
    response = await upload(handle, "Mine", wav_bytes(2.0))
    assert response.status_code == 403 and "--voice-uploads on" in response.json()["error"]
    assert (await voices(handle))["uploads"] is False
    async with handle.http() as client:
        assert (await client.delete("/api/voices/Mine")).status_code == 403
    await handle.shutdown()
    secured = await virtual_server(host="0.0.0.0", voice_uploads="on", auth_token="s3cret-token-for-tests")
    response = await upload(secured, "Mine", wav_bytes(2.0))
    assert response.status_code == 401
    allowed = await upload(secured, "Mine", wav_bytes(2.0), authorization="Bearer s3cret-token-for-tests")
    assert allowed.status_code == 201


async def test_a_stereo_48_khz_clip_is_taken(virtual_server, autojump_clock, tmp_path):
    t = np.arange(96_000) / 48_000
    stereo = np.stack([0.2 * np.sin(2 * np.pi * 220 * t), 0.1 * np.sin(2 * np.pi * 330 * t)]).astype(np.float32)
    path = tmp_path / "clip.wav"
    sphn.write_wav(str(path), stereo, 48_000)
    handle = await virtual_server()
    response = await upload(handle, "Stereo", path.read_bytes())
    assert response.status_code == 201 and response.json()["seconds"] == pytest.approx(2.0, abs=0.02)


async def test_the_upload_log_says_what_happened(virtual_server, autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="pplex_trio")
    handle = await virtual_server()
    await upload(handle, "Logged", wav_bytes(2.0))
    await upload(handle, "Bad name!", wav_bytes(2.0))
    assert "added voice Logged.pt from 127.0.0.1: a 2.0 s clip" in caplog.text
    assert "refused a voice upload from 127.0.0.1: a voice name is 1 to 48" in caplog.text


async def test_a_voice_the_engine_cannot_make_in_time_is_answered_before_the_connection_is_cut(
    virtual_server, autojump_clock
):
    # Each frame of a voice costs the stand-in engine 0.1 s: a 4 s clip (50 frames) needs 5 s, more than the
    # 3 s the client's connection may stay silent.  The client must get an answer, not a closed connection.
    from pplex_trio.engine import EchoEngine

    handle = await virtual_server(
        EchoEngine(2, delay_frames=1, prefill_steps=2, prefill_seconds=0.1), client_timeout=3.0
    )
    began = trio.current_time()
    busy = await upload(handle, "Slow", wav_bytes(4.0))
    assert busy.status_code == 503 and "too busy to make the voice in time" in busy.json()["error"]
    waited = trio.current_time() - began
    assert waited == pytest.approx(3.0 - 1.0) and int(busy.headers["retry-after"]) > 0  # a second to spare
    assert store_files(handle) == [] and (await voices(handle))["added"] == []
    assert (await upload(handle, "Quick", wav_bytes(1.0))).status_code == 201  # 13 frames: 1.3 s


def test_the_loudness_library_is_imported_at_start_not_at_the_first_upload():
    """Its import (SciPy: ~2 s holding the interpreter) at the first upload stalled the live ticks."""
    import subprocess
    import sys

    script = (
        "import sys, types\n"
        "from pplex_trio.server.voices._routes import VoiceUpload\n"
        "def state(allowed):\n"
        "    return types.SimpleNamespace(settings=types.SimpleNamespace(voice_uploads_allowed=allowed))\n"
        "VoiceUpload(state(False)); print('pyloudnorm' in sys.modules)\n"
        "VoiceUpload(state(True)); print('pyloudnorm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True"]
