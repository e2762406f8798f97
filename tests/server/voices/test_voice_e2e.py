"""A voice added over HTTP, end to end on real models: made as the reference makes it, spoken on every
protocol in one server run, kept across a restart, deleted while in use without ending the conversation.

The real server on the virtual network and clock (the models' calls run inline).
"""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import sphn
import torch
import trio

from _helpers.tiny_runs import FRAMES, GREEDY, direct_run, raw_conversation
from _helpers.ws import moshi_talk, moshi_url, raw_open
from pplex_trio.engine import Conversation, Sampling
from pplex_trio.model import VoicePrompt

HOST = "You work for SwiftPlex Appliances and your name is Farhod."


@pytest.fixture(scope="module")
def speech(speech_wav):
    pcm, rate = sphn.read(str(speech_wav))
    assert rate == 24_000
    return pcm[0]


@pytest.fixture
def clip(speech, tmp_path):
    """Three seconds of real speech as a WAV file."""
    path = tmp_path / "clip.wav"
    sphn.write_wav(str(path), speech[48_000:120_000], 24_000)
    return path


async def post_voice(handle, name: str, body: bytes) -> httpx.Response:
    async with handle.http(timeout=60) as client:
        return await client.post(
            "/api/voices", params={"name": name}, content=body, headers={"content-type": "audio/wav"}
        )


async def test_the_reference_voice_comes_out_of_an_upload(virtual_server, autojump_clock, golden_dir, tmp_path):
    """The golden checkpoint's TINY0.wav, uploaded: the kept voice is NVIDIA's voices/TINY0.pt."""
    from pplex_trio.engine._personaplex import PersonaPlexEngine

    engine = PersonaPlexEngine.load(str(golden_dir), num_slots=1)
    handle = await virtual_server(engine, slots=1, voice_store=tmp_path / "store")
    response = await post_voice(handle, "Uploaded", (golden_dir / "voices" / "TINY0.wav").read_bytes())
    assert response.status_code == 201 and response.json() == {"voice": "Uploaded.pt", "seconds": 2.0}
    kept = torch.load(tmp_path / "store" / "Uploaded.pt", weights_only=True)
    reference = torch.load(golden_dir / "voices" / "TINY0.pt", weights_only=True)
    assert kept["embeddings"].shape == reference["embeddings"].shape == (24, 1, 1, 64)
    assert torch.allclose(kept["embeddings"], reference["embeddings"], atol=1e-6, rtol=0)
    assert torch.equal(kept["cache"], reference["cache"])


async def moshi_frames(handle, voice: str, frames: np.ndarray, want: int = 5) -> list[np.ndarray]:
    return await moshi_talk(
        moshi_url(handle.ws_url, voice_prompt=voice, text_seed=1, audio_seed=2),
        frames,
        want,
        opener=handle.open_websocket,
    )


async def realtime_voice(handle, voice: str) -> tuple[dict, dict]:
    """session.update to ``voice``, then talk: (the session.updated event, the first audio delta)."""
    silence = base64.b64encode(bytes(1920 * 2)).decode()
    async with handle.open_websocket(handle.ws_url + "/v1/realtime") as ws:

        async def event(kind):
            with trio.fail_after(60):
                while True:
                    message = json.loads(await ws.get_message())
                    assert message["type"] != "error", message
                    if message["type"] == kind:
                        return message

        await event("session.created")
        await ws.send_message(
            json.dumps(
                {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": voice}}}}
            )
        )
        updated = await event("session.updated")
        for _ in range(5):
            await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
        delta = await event("response.output_audio.delta")
    return updated, delta


async def test_an_added_voice_on_every_protocol_then_a_restart_then_deleted_in_use(
    virtual_server, autojump_clock, tiny_engine, clip, speech, tmp_path
):
    store = tmp_path / "store"
    frames = speech[24_000 : 24_000 + FRAMES * 1920].reshape(FRAMES, 1920)
    handle = await virtual_server(tiny_engine, slots=2, voice_store=store)
    response = await post_voice(handle, "Mine", clip.read_bytes())
    assert response.status_code == 201 and response.json() == {"voice": "Mine.pt", "seconds": 3.0}
    assert VoicePrompt.from_file(store / "Mine.pt").num_steps == 38 - 1  # 72 000 samples: 38 frames, the first unused

    # Raw: exactly the engine's conversation with that voice (and not the one with a model voice).
    served, _ = await raw_conversation(handle, frames, persona=HOST, voice="Mine.pt", **GREEDY)
    mine = Conversation(persona=HOST, voice="Mine.pt", sampling=Sampling(**GREEDY))
    matches = [
        lead
        for lead in range(3)
        if np.array_equal(served[:FRAMES], direct_run(tiny_engine, mine, frames, lead)[:FRAMES])
    ]
    assert matches, "served audio differs from a direct engine run with the added voice"
    other = direct_run(
        tiny_engine, Conversation(persona=HOST, voice="NATF0.pt", sampling=Sampling(**GREEDY)), frames, matches[0]
    )
    assert not np.array_equal(other[:FRAMES], served[:FRAMES])
    # Moshi and Realtime take it by name too.
    assert len(await moshi_frames(handle, "Mine.pt", frames)) == 5
    updated, delta = await realtime_voice(handle, "Mine.pt")
    assert updated["session"]["audio"]["output"]["voice"] == "Mine.pt" and delta["delta"]
    await handle.shutdown()

    # A new server on the same store has it, and a conversation that uses it outlives its deletion.
    again = await virtual_server(tiny_engine, slots=2, voice_store=store)
    assert (await again.get("/api/voices")).json()["added"] == ["Mine.pt"]
    async with again.open_websocket(again.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws, timeout=60, voice="Mine.pt")
        got = 0

        async def talk(count):
            nonlocal got
            for frame in frames[:count]:
                await ws.send_message(frame.astype("<f4").tobytes())
                await trio.sleep(0.08)
            with trio.fail_after(30):
                while got < count:
                    if isinstance(await ws.get_message(), bytes):
                        got += 1

        await talk(5)
        async with again.http() as client:
            assert (await client.delete("/api/voices/Mine")).status_code == 200
        before = got
        await talk(10)
        assert got >= before + 5  # it talks on after its voice is gone
    assert (await again.get("/api/voices")).json()["added"] == []
