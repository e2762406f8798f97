"""Exactness of a Realtime and a Live resume on the tiny model: a 5 s outage mid-call leaves no trace.

As ``test_resume_tiny.py`` does for raw: every frame of the call is observed as
the model made it, with the input frame it heard; a direct run of the engine fed
exactly those heard frames (the outage's audio never among them) must make the
same output, and what the protocol sent from the resume on (its audio deltas as
PCM16, its transcript deltas) must be that direct run's, every frame.  The calls
are greedy, so the direct run is the reference of an uninterrupted call.
"""

import base64
import json

import numpy as np
import pytest
import sphn
import trio

from _helpers.tiny_runs import GREEDY
from _helpers.ws import FRAME
from pplex_trio.engine import Conversation, Sampling, SlotMode
from pplex_trio.protocol import live
from pplex_trio.protocol._realtime import SessionConfig
from pplex_trio.server.sessions._report import CallReport

HOST = "You work for SwiftPlex Appliances and your name is Farhod."
FRAMES = 16
OUTAGE = 5.0
# What each protocol calls its events: (path, audio in, audio out, text out)
PROTOCOLS = {
    "realtime": ("/v1/realtime", "input_audio_buffer.append", "response.output_audio.delta",
                 "response.output_audio_transcript.delta"),
    "live": ("/v1/live/sessions", "session.input_audio.append", "session.output_audio.delta",
             "session.output_transcript.delta"),
}  # fmt: skip


@pytest.fixture(scope="module")
def speech_frames(speech_wav):
    pcm, _ = sphn.read(str(speech_wav))
    start = 4 * 24000  # (speech all through: the file's first seconds are silent)
    frames = pcm[0, start : start + FRAMES * FRAME].reshape(FRAMES, FRAME)
    return np.clip(np.round(frames * 32768), -32768, 32767).astype("<i2")  # as the client sends it: PCM16


def greedy(config) -> Conversation:
    return Conversation(persona=config.instructions, voice=config.voice, sampling=Sampling(**GREEDY))


async def next_event(receive, kind: str) -> dict:
    with trio.fail_after(60):
        while (event := json.loads(await receive()))["type"] != kind:
            pass
    return event


async def open_call(handle, protocol: str):
    """A resumable call, live, on a connection the test may reset: (the bad client, its token)."""
    path = PROTOCOLS[protocol][0]
    bad = await handle.bad_client(path + "?resumable=1")
    if protocol == "realtime":
        await next_event(bad.receive, "session.created")
        session = {"type": "realtime", "instructions": HOST, "audio": {"output": {"voice": "NATM0.pt"}}}
        await bad.send(json.dumps({"type": "session.update", "session": session}))
        await bad.send(json.dumps({"type": "response.create"}))  # (starts it: the model speaks first)
        while "resume_token" not in (updated := await next_event(bad.receive, "session.updated"))["session"]:
            pass  # (the answer to the update: the token comes once the call is live)
        return bad, updated["session"]["resume_token"]
    session = {"model": "gpt-live-1", "instructions": HOST, "audio": {"output": {"voice": "NATM0.pt"}}}
    await bad.send(json.dumps({"type": "session.start", "session": session}))
    return bad, (await next_event(bad.receive, "session.started"))["session"]["resume_token"]


def append(protocol: str, frame: np.ndarray) -> str:
    return json.dumps({"type": PROTOCOLS[protocol][1], "audio": base64.b64encode(frame.tobytes()).decode()})


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_after_a_5s_outage_the_call_goes_on_as_if_it_never_was(
    virtual_server, autojump_clock, engine, speech_frames, monkeypatch, protocol
):
    monkeypatch.setattr(SessionConfig, "conversation", greedy)
    monkeypatch.setattr(live.LiveConfig, "conversation", greedy)
    timeline = []  # (heard, pcm) of every frame the model made for the call, in order
    observe = CallReport.on_frame
    monkeypatch.setattr(
        CallReport, "on_frame", lambda self, f: (timeline.append((f.heard.copy(), f.pcm.copy())), observe(self, f))
    )
    handle = await virtual_server(engine, slots=2)
    path, _, audio_out, text_out = PROTOCOLS[protocol]
    half = FRAMES // 2
    bad, token = await open_call(handle, protocol)
    for frame in speech_frames[:half]:
        await bad.send(append(protocol, frame))
        await trio.sleep(FRAME / 24000)
    bad.reset()
    stepped_before = len(timeline)
    await trio.sleep(OUTAGE)  # whatever the caller said meanwhile never reaches the model
    assert len(timeline) == stepped_before  # a paused row is not stepped
    received: list[dict] = []
    async with handle.open_websocket(path + "?resume=" + token) as ws:
        if protocol == "live":
            await ws.send_message(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
        resumed = await next_event(ws.get_message, "session.created" if protocol == "realtime" else "session.started")
        assert resumed["session"]["resume_token"] != token

        async def read():
            while True:
                received.append(json.loads(await ws.get_message()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for i, frame in enumerate(speech_frames[half:]):
                await ws.send_message(append(protocol, frame))
                if i >= 2:
                    await trio.sleep(FRAME / 24000)
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
    assert len(timeline) > stepped_before + 4
    # The same engine, straight: the conversation's prompt, then exactly the frames the model heard.
    engine.reset_all()
    conversation = Conversation(persona=HOST, voice="NATM0.pt", sampling=Sampling(**GREEDY))
    engine.prefill({0: engine.start(0, conversation)})
    direct_pcm, direct_text = [], []
    for i, (frame, served) in enumerate(timeline):
        batch = np.zeros((2, FRAME), np.float32)
        batch[0] = frame
        out = engine.step([SlotMode.LIVE, SlotMode.IDLE], batch)
        assert np.array_equal(out.pcm[0], served), f"frame {i} differs from the uninterrupted engine run"
        direct_pcm.append(out.pcm[0])
        direct_text.append(out.text[0] or "")
    # What the protocol sent from the resume on: the direct run's frames from the pause on, PCM16, and its words.
    audio = [np.frombuffer(base64.b64decode(e["delta"]), "<i2") for e in received if e["type"] == audio_out]
    assert len(audio) >= FRAMES - half
    after = range(stepped_before, stepped_before + len(audio))
    expected = [(np.clip(direct_pcm[i], -1, 32767 / 32768) * 32768).astype("<i2") for i in after]
    assert all(np.array_equal(a, b) for a, b in zip(audio, expected, strict=True))
    assert "".join(e["delta"] for e in received if e["type"] == text_out) == "".join(direct_text[i] for i in after)
