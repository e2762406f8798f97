"""LiveKit Agents' OpenAI Realtime plugin (``livekit-plugins-openai``) against ``/v1/realtime`` on the echo.

The plugin's ``RealtimeSession`` is driven as an ``AgentSession`` drives it, but
without a room: the persona goes in with ``update_instructions``, the room's
microphone track is pushed as 10 ms frames at 48 kHz (the plugin resamples to
24 kHz), ``generate_reply`` asks for a response (its future resolves only when
``response.created`` carries back the ``client_event_id`` of the request's
``response.metadata``), and when the caller speaks over the model the agent
interrupts and truncates the model's message at what it played. The generated
audio and text are read from each generation's streams, as the agent's
loudspeaker and transcript would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import numpy as np
import pytest

pytest.importorskip("livekit.plugins.openai")

from livekit import rtc  # noqa: E402
from livekit.agents import llm  # noqa: E402
from livekit.plugins import openai  # noqa: E402

from _helpers.aio import run_asyncio

logger = logging.getLogger(__name__)

ROOM_RATE = 48_000  # what a LiveKit room's audio track delivers
CHUNK_MS = 10


@dataclasses.dataclass
class Loudspeaker:
    """Every generation's audio and text, as an agent plays and shows them, with when each frame came."""

    audio: list[tuple[float, str, bytes]] = dataclasses.field(default_factory=list)  # (when, message id, PCM16)
    text: list[str] = dataclasses.field(default_factory=list)
    generations: list[llm.GenerationCreatedEvent] = dataclasses.field(default_factory=list)
    readers: list[asyncio.Task] = dataclasses.field(default_factory=list)

    def on_generation(self, generation: llm.GenerationCreatedEvent) -> None:
        self.generations.append(generation)
        self.readers.append(asyncio.create_task(self._read(generation)))

    async def _read(self, generation: llm.GenerationCreatedEvent) -> None:
        async for message in generation.message_stream:

            async def audio(message=message):
                async for frame in message.audio_stream:
                    assert (frame.sample_rate, frame.num_channels) == (24_000, 1)
                    self.audio.append((time.monotonic(), message.message_id, bytes(frame.data)))

            async def text(message=message):
                async for piece in message.text_stream:
                    self.text.append(str(piece))

            await asyncio.gather(audio(), text())

    def played_ms(self, message_id: str) -> int:
        return sum(len(pcm) // 2 for _, mid, pcm in self.audio if mid == message_id) * 1000 // 24_000

    def samples(self, since: float = 0.0) -> np.ndarray:
        pcm = b"".join(pcm for at, _, pcm in self.audio if at > since)
        return np.frombuffer(pcm, "<i2").astype(np.float32) / 32768


@dataclasses.dataclass
class Run:
    speaker: Loudspeaker
    sent: list[tuple[float, dict]]  # client events as the plugin queued them
    received: list[tuple[float, dict]]  # server events as the plugin read them
    errors: list[llm.RealtimeModelError]
    replies: list[llm.GenerationCreatedEvent]  # what the generate_reply futures resolved to
    started: float
    truncated_at: float | None
    close_took: float
    sockets: list


async def converse(http_url: str, line, recording_http) -> Run:
    http, sockets = recording_http()
    model = openai.realtime.RealtimeModel(
        base_url=f"{http_url}/v1",
        api_key="placeholder",
        model="personaplex",
        http_session=http,
        # LiveKit asks for the caller's words by default; this echo server transcribes nothing, and would say so
        # (a recoverable error naming --transcribe: tests/server/sessions/test_caller_words.py).
        input_audio_transcription=None,
    )  # voice: the default, "marin"
    session = model.session()
    speaker = Loudspeaker()
    sent: list[tuple[float, dict]] = []
    received: list[tuple[float, dict]] = []
    errors: list[llm.RealtimeModelError] = []
    session.on("openai_client_event_queued", lambda event: sent.append((time.monotonic(), event)))
    session.on("openai_server_event_received", lambda event: received.append((time.monotonic(), event)))
    session.on("error", errors.append)
    session.on("generation_created", speaker.on_generation)

    await session.update_instructions("You are a friendly assistant. Keep your answers short.")
    started = time.monotonic()
    barge_in = started + line.second_starts
    truncated_at: float | None = None

    def on_speech_started(_event: llm.InputSpeechStartedEvent) -> None:
        # The agent's side of a barge-in: stop the model and cut its message where the caller heard it end.
        nonlocal truncated_at
        if time.monotonic() < barge_in or truncated_at is not None or not speaker.audio:
            return
        message_id = speaker.audio[-1][1]
        session.interrupt()
        session.truncate(message_id=message_id, modalities=["audio"], audio_end_ms=speaker.played_ms(message_id))
        truncated_at = time.monotonic()

    session.on("input_speech_started", on_speech_started)

    async def microphone() -> None:
        for n, chunk in enumerate(line.chunks(ROOM_RATE, CHUNK_MS)):
            session.push_audio(
                rtc.AudioFrame(data=chunk, sample_rate=ROOM_RATE, num_channels=1, samples_per_channel=len(chunk) // 2)
            )
            await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK_MS / 1000 - time.monotonic()))

    mic = asyncio.create_task(microphone())
    # The plugin fails a reply whose response.created has not come back in 10 s.
    replies = [await session.generate_reply()]  # the agent's greeting starts the conversation
    await asyncio.sleep(line.second_starts + 0.8)  # well after the barge-in,
    replies.append(await session.generate_reply())  # the agent asks for one more reply
    await mic
    await asyncio.sleep(0.5)  # the echo of the last frames

    closing = time.monotonic()
    await session.aclose()
    close_took = time.monotonic() - closing
    await asyncio.wait_for(asyncio.gather(*speaker.readers), 2)  # the generations' streams are closed
    await model.aclose()
    await http.close()
    return Run(speaker, sent, received, errors, replies, started, truncated_at, close_took, sockets)


def test_livekit_openai_realtime_session_hears_the_echo(echo_server, caller, assert_echoed, recording_http):
    before, mark = echo_server.ended("realtime"), len(echo_server.log)
    run = run_asyncio(converse(echo_server.url, caller, recording_http))
    received = [event for _, event in run.received]

    assert not run.errors, [error.error for error in run.errors]
    assert [e for e in received if e["type"] == "error"] == []
    assert echo_server.problems_since(mark) == []

    # The voice is OpenAI's default, "marin": the server gave the session one of its own voices for it.
    updated = [e for e in received if e["type"] == "session.updated"]
    assert updated and updated[-1]["session"]["audio"]["output"]["voice"].endswith(".pt")
    assert updated[-1]["session"]["instructions"] == "You are a friendly assistant. Keep your answers short."

    # Both generate_reply calls resolved: the server echoed each request's metadata in response.created.
    assert [reply.user_initiated for reply in run.replies] == [True, True]
    requested = [
        event["response"]["metadata"]["client_event_id"] for _, event in run.sent if event["type"] == "response.create"
    ]
    created = {
        e["response"]["id"]: (e["response"].get("metadata") or {}).get("client_event_id")
        for e in received
        if e["type"] == "response.created"
    }
    assert [created[reply.response_id] for reply in run.replies] == requested

    # What came back is the caller's speech, both utterances, through the plugin's 48 → 24 kHz resampling.
    assert_echoed(caller.first, run.speaker.samples())
    assert_echoed(caller.second, run.speaker.samples())

    # The barge-in: the agent interrupted and truncated the model's message; the server confirmed and the
    # conversation went on (the rest of the second utterance came back after the truncation).
    assert run.truncated_at is not None, "the server's VAD did not report the caller speaking over the model"
    assert run.truncated_at < run.started + caller.second_starts + 1.5
    (truncate,) = [event for _, event in run.sent if event["type"] == "conversation.item.truncate"]
    confirmed = [e["item_id"] for e in received if e["type"] == "conversation.item.truncated"]
    assert truncate["item_id"] in confirmed
    assert_echoed(caller.second[caller.second.size // 2 :], run.speaker.samples(since=run.truncated_at))

    # Text: the echo's frame numbers, in order from the first, as the generations' transcripts.
    numbers = [int(piece) for piece in run.speaker.text]
    assert numbers[0] == 0 and numbers == sorted(set(numbers)), numbers
    assert len(numbers) >= 0.9 * len(run.speaker.audio)

    # A clean close: aclose returned at once and the server counted the conversation as closed by the
    # client. (The plugin sends its close frame and then cancels its own wait for the server's answer,
    # so its socket reads 1006 whatever the server does: the server's side is what is checked.)
    assert run.close_took < 1.0, run.close_took
    (socket,) = run.sockets
    assert socket.closed
    echo_server.wait_closed("realtime", before)
    logger.info(
        "livekit openai: %d audio frames, %d generations, close in %.3f s",
        len(run.speaker.audio),
        len(run.speaker.generations),
        run.close_took,
    )


def test_livekit_openai_realtime_session_hears_the_callers_words(hearing_server, caller, recording_http):
    """With LiveKit's default ``input_audio_transcription`` (it asks for the caller's words), a server that
    transcribes sends them: the session emits ``input_audio_transcription_completed``, interim with the words so
    far, then final with the turn, and keeps the turn as the user message's content in its chat context."""
    line = dataclasses.replace(caller, second=caller.second[:0], pause=0.0, tail=1.0)  # the VAD ends the turn

    async def listen():
        http, _sockets = recording_http()
        model = openai.realtime.RealtimeModel(
            base_url=f"{hearing_server.url}/v1", api_key="placeholder", model="personaplex", http_session=http
        )
        session = model.session()
        received: list[dict] = []
        transcribed: list[llm.InputTranscriptionCompleted] = []
        errors: list[llm.RealtimeModelError] = []
        final = asyncio.Event()

        def on_transcribed(event: llm.InputTranscriptionCompleted) -> None:
            transcribed.append(event)
            if event.is_final:
                final.set()

        session.on("openai_server_event_received", received.append)
        session.on("input_audio_transcription_completed", on_transcribed)
        session.on("error", errors.append)
        await session.update_instructions("You are a friendly assistant. Keep your answers short.")
        started = time.monotonic()
        for n, chunk in enumerate(line.chunks(ROOM_RATE, CHUNK_MS)):
            session.push_audio(
                rtc.AudioFrame(data=chunk, sample_rate=ROOM_RATE, num_channels=1, samples_per_channel=len(chunk) // 2)
            )
            await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK_MS / 1000 - time.monotonic()))
        await asyncio.wait_for(final.wait(), 3)  # (the turn ends 480 ms into the silence; its words 0.5 s later)
        chat = session.chat_ctx.copy()
        await session.aclose()
        await model.aclose()
        await http.close()
        return received, transcribed, errors, chat

    received, transcribed, errors, chat = run_asyncio(listen())
    assert not errors, [error.error for error in errors]
    assert [e for e in received if e["type"] == "error"] == []
    assert hearing_server.problems == []
    updated = [e for e in received if e["type"] == "session.updated"]
    assert updated[-1]["session"]["audio"]["input"]["transcription"] is not None

    (started,) = [e for e in received if e["type"] == "input_audio_buffer.speech_started"]
    item = started["item_id"]
    assert [(t.item_id, t.is_final) for t in transcribed] == [(item, False)] * len(hearing_server.heard) + [
        (item, True)
    ]
    assert transcribed[-1].transcript == hearing_server.heard_text
    assert transcribed[-2].transcript.strip() == hearing_server.heard_text  # the interim ones accumulate
    (message,) = [m for m in chat.items if m.id == item]
    assert message.role == "user" and hearing_server.heard_text in (message.text_content or ""), message
