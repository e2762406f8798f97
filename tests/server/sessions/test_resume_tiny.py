"""Exactness of a resume on the tiny model: a paused row keeps its whole state (KV cache, Mimi, sampling).

Every frame of the call is observed as the model made it, with the input
frame it heard (``OutputFrame.heard``), before and after a reset and a
resume; a direct run of the engine fed exactly those heard frames, with the
outage's audio never among them, must make exactly the same output.  A row
stepped while paused, or reset, would not.
"""

import json
import urllib.parse

import numpy as np
import pytest
import sphn
import trio

from _helpers.tiny_runs import GREEDY
from _helpers.ws import FRAME
from pplex_trio.engine import Conversation, Sampling, SlotMode
from pplex_trio.server.sessions._report import CallReport

HOST = "You work for SwiftPlex Appliances and your name is Farhod."
FRAMES = 16


@pytest.fixture(scope="module")
def speech_frames(speech_wav):
    pcm, _ = sphn.read(str(speech_wav))
    start = 4 * 24000  # (speech all through: the file's first seconds are silent)
    return pcm[0, start : start + FRAMES * FRAME].reshape(FRAMES, FRAME)


async def stream(ws, frames, received: list) -> None:
    """Send ``frames`` (arrays as float32, else as they are; three ahead, then one per tick), reading what comes
    back meanwhile."""

    async def read():
        while True:
            received.append(await ws.get_message())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        for i, frame in enumerate(frames):
            await ws.send_message(frame if isinstance(frame, bytes) else frame.astype("<f4").tobytes())
            if i >= 2:
                await trio.sleep(FRAME / 24000)
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()


async def test_after_a_resume_the_model_goes_on_as_if_the_outage_never_was(
    virtual_server, autojump_clock, engine, speech_frames, monkeypatch
):
    timeline = observe(monkeypatch)
    handle = await virtual_server(engine, slots=2)
    half = FRAMES // 2
    received: list = []
    bad = await handle.bad_client("/v1/audio/duplex")
    await bad.send(json.dumps({"type": "open", "persona": HOST, "voice": "NATM0.pt", **GREEDY}))
    with trio.fail_after(60):
        while (ready := json.loads(await bad.receive(timeout=60)))["type"] != "ready":
            pass
    for frame in speech_frames[:half]:
        await bad.send(frame.astype("<f4").tobytes())
        await trio.sleep(FRAME / 24000)
    bad.reset()
    stepped_before = len(timeline)
    await trio.sleep(3)  # the outage: whatever the caller said meanwhile never reaches the model
    assert len(timeline) == stepped_before  # a paused row is not stepped
    async with handle.open_websocket("/v1/audio/duplex") as ws:
        await ws.send_message(json.dumps({"type": "open", "resume": ready["resume"]}))
        assert json.loads(await ws.get_message())["resumed"] is True
        await stream(ws, speech_frames[half:], received)
    assert len(timeline) > stepped_before + 4
    heard = [h for h, _, _ in timeline]
    assert all(np.abs(f).max() > 0.01 for f in speech_frames)
    assert sum(np.array_equal(h, f) for h in heard for f in speech_frames) >= FRAMES - 2  # (the speech was heard)
    assert_as_uninterrupted(engine, timeline)


def observe(monkeypatch) -> list:
    """(heard, pcm, text) of every frame the model makes for the call, in order, as the model made it."""
    timeline: list = []
    seen = CallReport.on_frame
    monkeypatch.setattr(
        CallReport,
        "on_frame",
        lambda self, f: (timeline.append((f.heard.copy(), f.pcm.copy(), f.text)), seen(self, f)),
    )
    return timeline


def assert_as_uninterrupted(engine, timeline) -> None:
    """The same engine, straight: the conversation's prompt, then exactly the frames the model heard; every
    frame's audio and text piece the same."""
    engine.reset_all()
    conversation = Conversation(persona=HOST, voice="NATM0.pt", sampling=Sampling(**GREEDY))
    engine.prefill({0: engine.start(0, conversation)})
    for i, (frame, served, text) in enumerate(timeline):
        batch = np.zeros((2, FRAME), np.float32)
        batch[0] = frame
        direct = engine.step([SlotMode.LIVE, SlotMode.IDLE], batch)
        assert np.array_equal(direct.pcm[0], served), f"frame {i} differs from the uninterrupted engine run"
        assert direct.text[0] == text, f"frame {i}'s text differs from the uninterrupted engine run"


async def test_a_moshi_call_after_a_5_s_outage_goes_on_as_if_the_outage_never_was(
    virtual_server, autojump_clock, engine, speech_frames, monkeypatch
):
    """The same on ``/api/chat?resumable=1``: Ogg Opus in (what the model heard is the decoded audio), the same
    session id after ``?resume=TOKEN``."""
    timeline = observe(monkeypatch)
    handle = await virtual_server(engine, slots=2)
    query = urllib.parse.urlencode({"resumable": 1, "text_prompt": HOST, "voice_prompt": "NATM0.pt", **GREEDY})
    bad = await handle.bad_client(f"/api/chat?{query}")
    assert await bad.receive(timeout=60) == b"\x00"
    token = json.loads((await bad.receive())[1:])["token"]
    (before,) = (await handle.get_json("/api/sessions"))["sessions"]
    writer = sphn.OpusStreamWriter(24000)
    half = FRAMES // 2
    for frame in speech_frames[:half]:
        await bad.send(b"\x01" + writer.append_pcm(frame))
        await trio.sleep(FRAME / 24000)
    bad.reset()
    stepped_before = len(timeline)
    await trio.sleep(5)  # the outage
    assert len(timeline) == stepped_before  # a paused row is not stepped
    async with handle.open_websocket(f"/api/chat?resume={token}") as ws:
        assert await ws.get_message() == b"\x00"
        assert json.loads((await ws.get_message())[1:])["resumed"] is True
        (after,) = (await handle.get_json("/api/sessions"))["sessions"]
        assert after["id"] == before["id"]
        writer = sphn.OpusStreamWriter(24000)  # (a new connection: a new Ogg stream)
        oggs = [b"\x01" + writer.append_pcm(frame) for frame in speech_frames[half:]]
        await stream(ws, oggs, [])
    assert len(timeline) > stepped_before + 4
    assert sum(np.abs(h).max() > 0.01 for h, _, _ in timeline) >= FRAMES - 6  # (the speech was heard)
    assert_as_uninterrupted(engine, timeline)
