"""The caller's words end to end on the tiny pair: ``--model tiny --transcribe tiny`` behind a Realtime call.

The real :class:`PersonaPlexEngine` with the random-weight ``tiny-stt`` beside it, the real server on the
virtual network and clock (the engine's calls run inline, so however long a step takes here, the frames keep
their time), and a GA Realtime client that asks for the caller's words while it streams six seconds of speech.
The random transcriber's words mean nothing; what is checked is that whatever it says reaches the client as
the SDK's own events, in the item of the caller's speech, and that a turn is completed (by the transcriber's
end-of-turn head or, failing that, the VAD).
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import sphn
import trio

pydantic = pytest.importorskip("pydantic")
openai_ga = pytest.importorskip("openai.types.realtime")

SERVER_EVENT = pydantic.TypeAdapter(openai_ga.RealtimeServerEvent)
FRAME = 1920  # 80 ms at 24 kHz
SPEECH_S = 6.0
ASK = {"type": "realtime", "audio": {"input": {"transcription": {"model": "kyutai/stt-1b-en_fr"}}}}


@pytest.fixture(scope="module")
def transcribing_engine():
    """The tiny PersonaPlex with ``tiny-stt`` beside it (``--model tiny --transcribe tiny``), built once."""
    from pplex_trio.engine import PersonaPlexEngine

    return PersonaPlexEngine.load("tiny", num_slots=1, transcribe="tiny-stt")


@pytest.fixture
def engine(transcribing_engine):
    transcribing_engine.reset_all()
    return transcribing_engine


@pytest.fixture(scope="module")
def speech(speech_wav) -> np.ndarray:
    """Six seconds of real speech, then as long of silence (for the VAD's turn end), in 80 ms frames."""
    pcm, _ = sphn.read(str(speech_wav))
    talk = pcm[0, : int(SPEECH_S * 24_000) // FRAME * FRAME]
    frames = np.concatenate([talk, np.zeros(talk.size, np.float32)]).astype(np.float32)
    return frames.reshape(-1, FRAME)


def _pcm16(frame: np.ndarray) -> str:
    return base64.b64encode((np.clip(frame, -1, 1) * 32767).astype("<i2").tobytes()).decode()


async def test_a_realtime_caller_gets_the_tiny_transcribers_words_in_the_item_of_their_speech(
    virtual_server, autojump_clock, engine, speech
):
    handle = await virtual_server(engine, slots=1)
    assert (await handle.get_json("/api/info"))["transcribes_caller"] is True
    events: list[dict] = []
    async with handle.open_websocket("/v1/realtime", subprotocols=["realtime"]) as ws:

        async def read() -> None:
            while True:
                event = json.loads(await ws.get_message())
                SERVER_EVENT.validate_python(event)  # each one a valid event of the SDK's
                events.append(event)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await ws.send_message(json.dumps({"type": "session.update", "session": ASK}))
            for frame in speech:
                await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": _pcm16(frame)}))
                await trio.sleep(0.08)
            await trio.sleep(1.0)
            nursery.cancel_scope.cancel()
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, [e for e in events if e["type"] == "error"]
    updated = next(e for e in events if e["type"] == "session.updated")["session"]
    assert updated["audio"]["input"]["transcription"] is not None
    deltas = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"]
    completed = [e for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"]
    # The random transcriber does say things (its pieces mean nothing), and ends at least one turn.
    assert deltas and all(d["delta"] for d in deltas) and completed
    # Every piece in a user item the client was told of first; each completed turn is its item's pieces.
    added = {
        e["item"]["id"]: i
        for i, e in enumerate(events)
        if e["type"] == "conversation.item.added" and e["item"]["role"] == "user"
    }
    for i, delta in enumerate(events):
        if delta["type"] == "conversation.item.input_audio_transcription.delta":
            assert delta["item_id"] in added and added[delta["item_id"]] < i
    for done in completed:
        item = done["item_id"]
        pieces = [d["delta"] for d in deltas if d["item_id"] == item]
        assert pieces and done["transcript"].split() == "".join(pieces).split()  # (its words, spaced)
        assert events.index(done) > max(i for i, e in enumerate(events) if e in deltas and e["item_id"] == item)
    # The caller's speech the VAD heard is an item that carries their words (words heard outside it, as a
    # random transcriber's may be, open an item of their own).
    speech = {e["item_id"] for e in events if e["type"] == "input_audio_buffer.speech_started"}
    assert speech & {d["item_id"] for d in deltas}
