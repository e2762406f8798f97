"""Pipecat's OpenAI Realtime service (``pipecat-ai``) in a pipeline, against ``/v1/realtime`` on the echo.

The pipeline is Pipecat's speech-to-speech template without a transport: the
test queues the microphone's frames (16 kHz, 20 ms, as Pipecat's transports
deliver them) at the head of the pipeline and a sink collects what the service
pushes downstream. As in the template, a context message goes in first
(``conversation.item.create``) and then ``response.create``; when the caller
speaks over the model, the service truncates the model's audio
(``conversation.item.truncate``). Pipecat treats any ``error`` event from the
server as fatal to its connection, so the conversation only goes on if the
server answers all of this as OpenAI does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time

import numpy as np
import pytest

pytest.importorskip("pipecat.services.openai.realtime.llm")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterimTranscriptionFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.realtime import events  # noqa: E402
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from _helpers.aio import run_asyncio

logger = logging.getLogger(__name__)

MIC_RATE = 16_000  # Pipecat's default input rate; the service resamples to the API's 24 kHz
CHUNK_MS = 20


def samples(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768


class RecordedService(OpenAIRealtimeLLMService):
    """Pipecat's service as shipped, noting the client events it sends and the sockets it opens."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sent: list[tuple[float, events.ClientEvent]] = []
        self.sockets: list = []

    async def send_client_event(self, event):
        self.sent.append((time.monotonic(), event))
        await super().send_client_event(event)

    async def _connect(self):
        await super()._connect()
        if self._websocket is not None:
            self.sockets.append(self._websocket)

    def sent_of(self, kind: str) -> list[tuple[float, events.ClientEvent]]:
        return [(at, event) for at, event in self.sent if event.type == kind]


class FarService(RecordedService):
    """The service with a server 150 ms away: session.created comes back 300 ms after the connection.

    Pipecat answers session.created with its session.update (persona, voice),
    but sends the microphone's audio as soon as it is connected: over a real
    network the first audio reaches the server before the session.update.
    """

    async def _handle_evt_session_created(self, evt):
        await asyncio.sleep(0.3)
        await super()._handle_evt_session_created(evt)


class Speaker(FrameProcessor):
    """The pipeline's loudspeaker: keeps the model's audio and text, with when they arrived."""

    def __init__(self):
        super().__init__()
        self.audio: list[tuple[float, bytes]] = []
        self.text: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            assert (frame.sample_rate, frame.num_channels) == (24_000, 1)
            self.audio.append((time.monotonic(), frame.audio))
        elif isinstance(frame, TTSTextFrame):
            self.text.append(frame.text)
        await self.push_frame(frame, direction)


class Ear(FrameProcessor):
    """Between the user's context aggregator and the service: keeps the caller's transcription frames, which the
    service pushes upstream, towards the aggregator."""

    def __init__(self):
        super().__init__()
        self.interim: list[InterimTranscriptionFrame] = []
        self.final: list[TranscriptionFrame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, InterimTranscriptionFrame):
            self.interim.append(frame)
        elif isinstance(frame, TranscriptionFrame):
            self.final.append(frame)
        await self.push_frame(frame, direction)


@dataclasses.dataclass
class Run:
    service: RecordedService
    speaker: Speaker
    ear: Ear
    context: LLMContext
    received: list[tuple[float, dict]]  # every server event, as Pipecat parsed it
    errors: list[ErrorFrame]
    started: float  # when the first microphone frame went in
    end_took: float  # from queueing the EndFrame to the pipeline finished


async def converse(
    ws_url: str,
    line,
    monkeypatch,
    service_class: type[RecordedService] = RecordedService,
    transcription: events.InputAudioTranscription | None = None,
) -> Run:
    received: list[tuple[float, dict]] = []
    parse = events.parse_server_event

    def recording_parse(message):  # every event the service reads goes through here
        received.append((time.monotonic(), json.loads(message)))
        return parse(message)

    monkeypatch.setattr(events, "parse_server_event", recording_parse)

    service = service_class(
        api_key="placeholder",
        base_url=f"{ws_url}/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(
            model="personaplex",
            system_instruction="You are a friendly assistant. Keep your answers short.",
            session_properties=events.SessionProperties(
                audio=events.AudioConfiguration(
                    input=events.AudioInput(transcription=transcription) if transcription else None,
                    output=events.AudioOutput(voice="alloy"),
                )
            ),
        ),
    )
    context = LLMContext([{"role": "developer", "content": "Say hello!"}])
    user, assistant = LLMContextAggregatorPair(context)
    speaker, ear = Speaker(), Ear()
    worker = PipelineWorker(
        Pipeline([user, ear, service, speaker, assistant]),
        params=PipelineParams(audio_in_sample_rate=MIC_RATE),
        idle_timeout_secs=None,
        enable_rtvi=False,
    )
    errors: list[ErrorFrame] = []

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker, frame):
        errors.append(frame)

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)

    async def microphone() -> tuple[float, float]:
        await worker.queue_frames([LLMRunFrame()])  # the template's "kick off the conversation"
        started = time.monotonic()
        for n, chunk in enumerate(line.chunks(MIC_RATE, CHUNK_MS)):
            await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=MIC_RATE, num_channels=1))
            await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK_MS / 1000 - time.monotonic()))
        await asyncio.sleep(0.5)  # the echo of the last frames
        ending = time.monotonic()
        await worker.queue_frame(EndFrame())
        return started, ending

    mic = asyncio.create_task(microphone())
    await asyncio.wait_for(runner.run(), timeout=line.audio.size / 24_000 + 10)
    started, ending = mic.result()
    return Run(service, speaker, ear, context, received, errors, started, time.monotonic() - ending)


def test_pipecat_realtime_pipeline_hears_the_echo(echo_server, caller, assert_echoed, monkeypatch):
    before, mark = echo_server.ended("realtime"), len(echo_server.log)
    run = run_asyncio(converse(echo_server.ws_url, caller, monkeypatch))
    kinds = [event["type"] for _, event in run.received]

    # Nothing went wrong on either side: Pipecat drops its connection on any error event.
    assert not run.errors, run.errors
    assert "error" not in kinds, [event for _, event in run.received if event["type"] == "error"]
    assert echo_server.problems_since(mark) == []

    # The template's opening: the context message was taken in as a conversation item, then a response.
    ((_, item),) = run.service.sent_of("conversation.item.create")
    added = [event for _, event in run.received if event["type"] == "conversation.item.added"]
    assert item.item.id in [event["item"]["id"] for event in added]
    assert run.service.sent_of("response.create") and "response.created" in kinds
    updated = [event for _, event in run.received if event["type"] == "session.updated"]
    assert updated[-1]["session"]["audio"]["output"]["voice"].endswith(".pt")  # "alloy", as a model voice

    # What came back is the caller's speech, both utterances, after Pipecat's 16 → 24 kHz resampling.
    audio = samples(b"".join(chunk for _, chunk in run.speaker.audio))
    assert_echoed(caller.first, audio)
    assert_echoed(caller.second, audio)

    # The barge-in: the caller spoke again while the model's audio streamed; Pipecat truncated the
    # model's item, the server confirmed, and the conversation went on (the second utterance came back
    # after the truncation).
    barge_in = run.started + caller.second_starts
    truncates = [(at, event) for at, event in run.service.sent_of("conversation.item.truncate") if at >= barge_in]
    assert truncates, "Pipecat did not truncate the model's audio when the caller spoke over it"
    truncated_at, truncate = truncates[0]
    assert truncated_at < barge_in + 1.5
    confirmed = [event for _, event in run.received if event["type"] == "conversation.item.truncated"]
    assert truncate.item_id in [event["item_id"] for event in confirmed]
    later = samples(b"".join(chunk for at, chunk in run.speaker.audio if at > truncated_at))
    assert_echoed(caller.second[caller.second.size // 2 :], later)

    # Text: the echo's frame numbers, in order from the first.
    numbers = [int(piece) for piece in run.speaker.text]
    assert numbers[0] == 0 and numbers == sorted(set(numbers)), numbers
    assert len(numbers) >= 0.9 * len(run.speaker.audio)

    # A clean close: the EndFrame took the pipeline down at once, the server answered the close frame,
    # and it counted the conversation as closed by the client.
    assert run.end_took < 1.0, run.end_took
    (socket,) = run.service.sockets
    assert socket.close_code == 1000  # the server's answer to the close frame (1006 had it not answered)
    echo_server.wait_closed("realtime", before)
    logger.info(
        "pipecat: %d audio frames, %d text pieces, truncated %.2f s after the barge-in",
        len(run.speaker.audio),
        len(numbers),
        truncated_at - barge_in,
    )


def test_pipecat_with_the_server_a_round_trip_away(echo_server, caller, assert_echoed, monkeypatch):
    """The microphone's first audio reaches the server before Pipecat's session.update: the persona and
    voice still apply, with no error (an error would end Pipecat's connection), and the echo comes back."""
    before, mark = echo_server.ended("realtime"), len(echo_server.log)
    line = dataclasses.replace(caller, second=caller.second[:0], pause=0.0)  # one utterance
    run = run_asyncio(converse(echo_server.ws_url, line, monkeypatch, FarService))
    first_update = min(at for at, _ in run.service.sent_of("session.update"))
    assert min(at for at, _ in run.service.sent_of("input_audio_buffer.append")) < first_update  # the race, run

    assert [event for _, event in run.received if event["type"] == "error"] == []
    assert not run.errors, run.errors
    assert echo_server.problems_since(mark) == []
    updated = [event["session"] for _, event in run.received if event["type"] == "session.updated"]
    assert updated and updated[-1]["instructions"] == "You are a friendly assistant. Keep your answers short."
    assert updated[-1]["audio"]["output"]["voice"].endswith(".pt")
    assert_echoed(caller.first, samples(b"".join(chunk for _, chunk in run.speaker.audio)))
    echo_server.wait_closed("realtime", before)


def test_pipecat_hears_the_callers_words(hearing_server, caller, monkeypatch):
    """Asked for with Pipecat's ``InputAudioTranscription`` (its default model, gpt-realtime-whisper), the
    caller's words come as the service's ``InterimTranscriptionFrame``s and then a ``TranscriptionFrame``, which
    the user's context aggregator takes into the context as the user's message."""
    line = dataclasses.replace(caller, second=caller.second[:0], pause=0.0)  # one utterance
    run = run_asyncio(
        converse(hearing_server.ws_url, line, monkeypatch, transcription=events.InputAudioTranscription())
    )
    assert not run.errors, run.errors
    assert [event for _, event in run.received if event["type"] == "error"] == []
    assert hearing_server.problems == []
    (update, *_) = [event for _, event in run.service.sent_of("session.update")]
    assert update.session.audio.input.transcription.model == "gpt-realtime-whisper"

    # The server's events, in the user item of the caller's speech.
    (started,) = [event for _, event in run.received if event["type"] == "input_audio_buffer.speech_started"]
    deltas = [e for _, e in run.received if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert [d["delta"] for d in deltas] == hearing_server.heard
    assert {d["item_id"] for d in deltas} == {started["item_id"]}

    # Pipecat's frames: the pieces as they came, then the whole turn.
    assert [frame.text for frame in run.ear.interim] == hearing_server.heard
    assert [frame.text for frame in run.ear.final] == [hearing_server.heard_text]
    assert run.ear.final[0].result.item_id == started["item_id"]

    # The user's context aggregator took the turn into the conversation.
    said = [m["content"] for m in run.context.get_messages() if m.get("role") == "user"]
    assert any(
        hearing_server.heard_text in (content if isinstance(content, str) else json.dumps(content)) for content in said
    ), run.context.get_messages()
