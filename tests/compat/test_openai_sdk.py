"""The official ``openai`` SDK's Realtime client, GA and beta, in a whole conversation on the echo.

``tests/server/sessions/test_realtime_sdk.py`` checks the SDK's dialects event by event
(formats, errors, the token, the tiny model); here the SDK is used as a voice
agent uses it, with real speech: an OpenAI voice name, a context message, a
response asked for with metadata, the caller's microphone streamed in real
time, and when the caller speaks over the model, the agent truncates the
model's message at what it played. Every event the server sends is validated
against the SDK's own ``RealtimeServerEvent`` union of that dialect.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent  # noqa: E402
from openai.types.realtime import RealtimeServerEvent as ServerEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402

from _helpers.aio import run_asyncio  # noqa: E402

logger = logging.getLogger(__name__)

VALIDATORS = {False: TypeAdapter(ServerEvent), True: TypeAdapter(BetaServerEvent)}
CHUNK_MS = 40
PERSONA = "You are a friendly assistant. Keep your answers short."


def samples(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768


@dataclasses.dataclass
class Run:
    events: list[tuple[float, dict]]  # every server event, with when it came
    started: float
    truncate: dict | None  # the truncate the agent sent
    truncated_at: float
    close_took: float

    def of(self, *kinds: str) -> list[dict]:
        return [event for _, event in self.events if event["type"] in kinds]


async def converse(server, line, beta: bool) -> Run:
    client = openai.AsyncOpenAI(
        api_key="placeholder", base_url=f"{server.url}/v1", websocket_base_url=f"{server.ws_url}/v1"
    )
    audio_delta = "response.audio.delta" if beta else "response.output_audio.delta"
    events: list[tuple[float, dict]] = []
    played: dict[str, int] = {}  # samples of each of the model's items received
    truncate: dict | None = None
    truncated_at = 0.0
    started = time.monotonic() + 3600.0  # until the microphone starts

    async with (client.beta.realtime if beta else client.realtime).connect(model="personaplex") as connection:

        async def listen() -> None:
            nonlocal truncate, truncated_at
            while True:
                try:
                    event = json.loads(await connection.recv_bytes())
                except ConnectionClosed:
                    return
                if not event["type"].startswith("pplex."):  # our queue event is not OpenAI's
                    VALIDATORS[beta].validate_python(event)
                events.append((time.monotonic(), event))
                if event["type"] == audio_delta:
                    played[event["item_id"]] = played.get(event["item_id"], 0) + len(event["delta"]) * 3 // 8
                elif (
                    event["type"] == "input_audio_buffer.speech_started"
                    and truncate is None
                    and time.monotonic() >= started + line.second_starts
                    and played
                ):
                    # The caller speaks over the model: cut its message where the caller stopped hearing it.
                    item = list(played)[-1]
                    truncate = dict(item_id=item, content_index=0, audio_end_ms=played[item] * 1000 // 24_000)
                    truncated_at = time.monotonic()
                    await connection.conversation.item.truncate(**truncate)

        listener = asyncio.create_task(listen())
        if beta:
            await connection.session.update(session={"instructions": PERSONA, "voice": "alloy"})
        else:
            await connection.session.update(
                session={"type": "realtime", "instructions": PERSONA, "audio": {"output": {"voice": "marin"}}}
            )
        await connection.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello!"}]}
        )
        await connection.response.create(response={"metadata": {"client_event_id": "greeting"}})

        started = time.monotonic()
        for n, chunk in enumerate(line.chunks(24_000, CHUNK_MS)):
            await connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK_MS / 1000 - time.monotonic()))
        # The echo of the last frames: wait until the output has been quiet for 0.5 s (at most 5 s), so
        # that on a loaded machine the close does not fall between a frame's audio and its transcript.
        give_up = time.monotonic() + 5.0
        while time.monotonic() < give_up:
            last = max((at for at, event in events if event["type"] == audio_delta), default=started)
            if time.monotonic() - last >= 0.5:
                break
            await asyncio.sleep(0.05)

        closing = time.monotonic()
        await connection.close()
        close_took = time.monotonic() - closing
        await asyncio.wait_for(listener, 2)
    await client.close()
    return Run(events, started, truncate, truncated_at, close_took)


@pytest.mark.serial  # a conversation at real time, barge-in included: beside the parallel suite it starved once
@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_openai_sdk_conversation_with_a_barge_in(echo_server, caller, assert_echoed, beta):
    before, mark = echo_server.ended("realtime"), len(echo_server.log)
    run = run_asyncio(converse(echo_server, caller, beta))

    assert run.of("error") == []
    assert echo_server.problems_since(mark) == []

    # The OpenAI voice name became one of the model's voices; the persona is the session's.
    session = run.of("session.updated")[-1]["session"]
    assert (session["voice"] if beta else session["audio"]["output"]["voice"]).endswith(".pt")
    assert session["instructions"] == PERSONA

    # The context message became a conversation item, in the dialect's words.
    if beta:
        (created,) = run.of("conversation.item.created")
        assert created["item"]["content"] == [{"type": "input_text", "text": "Say hello!"}]
    else:
        (added,), (done,) = run.of("conversation.item.added"), run.of("conversation.item.done")
        assert added["item"]["id"] == done["item"]["id"]
        assert done["item"]["content"] == [{"type": "input_text", "text": "Say hello!"}]

    # The response asked for carries its metadata from created to done.
    greeting = run.of("response.created")[0]["response"]
    assert greeting["metadata"] == {"client_event_id": "greeting"}
    (greeting_done,) = [e for e in run.of("response.done") if e["response"]["id"] == greeting["id"]]
    assert greeting_done["response"]["metadata"] == {"client_event_id": "greeting"}

    # What came back is the caller's speech, both utterances, one 80 ms frame per delta.
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    pcm = [base64.b64decode(e["delta"]) for e in run.of(delta)]
    assert {len(frame) for frame in pcm} == {1920 * 2}
    audio = samples(b"".join(pcm))
    assert_echoed(caller.first, audio)
    assert_echoed(caller.second, audio)

    # The barge-in: the agent truncated the model's message, the server confirmed it as asked, and the
    # conversation went on (the rest of the second utterance came back after the truncation).
    assert run.truncate is not None, "the server's VAD did not report the caller speaking over the model"
    assert run.truncated_at < run.started + caller.second_starts + 1.5
    (confirmed,) = run.of("conversation.item.truncated")
    assert {key: confirmed[key] for key in run.truncate} == run.truncate
    later = b"".join(
        base64.b64decode(e["delta"]) for at, e in run.events if e["type"] == delta and at > run.truncated_at
    )
    assert_echoed(caller.second[caller.second.size // 2 :], samples(later))

    # Text: the echo's frame numbers, one per frame, in order from the first.
    transcript = "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta"
    assert [int(e["delta"]) for e in run.of(transcript)] == list(range(len(pcm)))

    # A clean close: close() returned at once (it waits for the server's close frame) and the server
    # counted the conversation as closed by the client.
    assert run.close_took < 1.0, run.close_took
    echo_server.wait_closed("realtime", before)
    logger.info(
        "openai sdk (%s): %d frames, truncated %.2f s after the barge-in, close in %.3f s",
        "beta" if beta else "ga",
        len(pcm),
        run.truncated_at - run.started - caller.second_starts,
        run.close_took,
    )
