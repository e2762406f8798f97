"""Pipecat's OpenAI Live service (``OpenAILiveLLMService``) in a pipeline, against ``/v1/live/sessions`` on the echo.

The pipeline is a transport-less Live bot: the test queues the microphone's
frames (16 kHz, 20 ms, as Pipecat's transports deliver them) at the head of the
pipeline and a sink collects what the service pushes downstream. The service
connects at setup, sends ``session.start`` on the first context frame
(``LLMRunFrame``) and drops the microphone's audio until ``session.started``:
a caller talks once the call is up, so the microphone starts on the service's
``on_session_started``. An ``EndFrame`` hangs up: ``session.close``, then a
wait (up to 10 s) for ``session.closed`` before the socket closes.

Pipecat treats an ``error`` event before ``session.started`` as fatal, after it
as a non-fatal pipeline error. With an opening instruction (a trailing
developer message in the context) it sends ``session.commentary.append`` once
the session has started, which this server refuses: the call must go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time

import numpy as np
import pytest

pytest.importorskip("pipecat.services.openai.live.llm")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterimTranscriptionFrame,
    LLMRunFrame,
    OutputAudioRawFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.live import events  # noqa: E402
from pipecat.services.openai.live.llm import OpenAILiveLLMService  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from _helpers.aio import run_asyncio

logger = logging.getLogger(__name__)

MIC_RATE = 16_000  # Pipecat's default input rate; the service resamples to the API's 24 kHz
CHUNK_MS = 20
RATE = 24_000
PERSONA = "You are a friendly assistant. Keep your answers short."


def samples(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768


class RecordedService(OpenAILiveLLMService):
    """Pipecat's service as shipped, noting the client events it sends and the sockets it opens."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sent: list[tuple[float, dict]] = []
        self.sockets: list = []

    async def send_client_event(self, event):
        self.sent.append((time.monotonic(), event.to_payload()))
        await super().send_client_event(event)

    async def _connect(self):
        await super()._connect()
        if self._websocket is not None and self._websocket not in self.sockets:
            self.sockets.append(self._websocket)

    def sent_of(self, kind: str) -> list[dict]:
        return [event for _, event in self.sent if event["type"] == kind]


class Speaker(FrameProcessor):
    """The pipeline's loudspeaker: keeps the model's audio and text; tells when enough audio has come."""

    def __init__(self):
        super().__init__()
        self.audio = bytearray()
        self.frames = 0
        self.text: list[str] = []
        self._wanted: tuple[int, asyncio.Event] | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputAudioRawFrame):
            assert (frame.sample_rate, frame.num_channels) == (RATE, 1)
            self.audio += frame.audio
            self.frames += 1
            if self._wanted is not None and len(self.audio) >= self._wanted[0]:
                self._wanted[1].set()
        elif isinstance(frame, TTSTextFrame):
            self.text.append(frame.text)
        await self.push_frame(frame, direction)

    async def heard(self, seconds: float, timeout: float) -> None:
        """Until ``seconds`` of the model's audio have come in all."""
        self._wanted = (int(seconds * RATE) * 2, asyncio.Event())
        if len(self.audio) < self._wanted[0]:
            await asyncio.wait_for(self._wanted[1].wait(), timeout)


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
    received: list[dict]  # every server event, as Pipecat read it
    errors: list[ErrorFrame]
    mic_from: float  # seconds of the model's audio already out when the microphone started
    end_took: float  # from queueing the EndFrame to the pipeline finished


async def converse(ws_url: str, line, monkeypatch, *, persona: str | None = None, opening: str | None = None) -> Run:
    """One call: the caller's ``line`` said from the moment the session has started, then hang up."""
    received: list[dict] = []
    parse = events.parse_server_event

    def recording_parse(message):  # every event the service reads goes through here
        received.append(json.loads(message))
        return parse(message)

    monkeypatch.setattr(events, "parse_server_event", recording_parse)

    service = RecordedService(
        api_key="placeholder",
        base_url=f"{ws_url}/v1/live/sessions",
        settings=OpenAILiveLLMService.Settings(system_instruction=persona),
    )
    context = LLMContext([{"role": "developer", "content": opening}] if opening else None)
    user, assistant = LLMContextAggregatorPair(context)
    speaker, ear = Speaker(), Ear()
    worker = PipelineWorker(
        Pipeline([user, ear, service, speaker, assistant]),
        params=PipelineParams(audio_in_sample_rate=MIC_RATE),
        idle_timeout_secs=None,
        enable_rtvi=False,
    )
    errors: list[ErrorFrame] = []
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker, frame):
        errors.append(frame)

    @service.event_handler("on_session_started")
    async def on_started(_service, _session):
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)

    async def microphone() -> tuple[float, float]:
        await worker.queue_frames([LLMRunFrame()])  # the bot's "start the conversation": session.start
        await asyncio.wait_for(started.wait(), 10)
        mic_from = len(speaker.audio) / 2 / RATE
        begin = time.monotonic()
        for n, chunk in enumerate(line.chunks(MIC_RATE, CHUNK_MS)):
            await worker.queue_frame(InputAudioRawFrame(audio=chunk, sample_rate=MIC_RATE, num_channels=1))
            await asyncio.sleep(max(0.0, begin + (n + 1) * CHUNK_MS / 1000 - time.monotonic()))
        # The echo of the last frames: the model's audio, which never stops, runs on past what was said.
        await speaker.heard(mic_from + line.audio.size / RATE + 0.3, timeout=3)
        ending = time.monotonic()
        await worker.queue_frame(EndFrame())
        return mic_from, ending

    mic = asyncio.create_task(microphone())
    await asyncio.wait_for(runner.run(), timeout=line.audio.size / RATE + 20)
    mic_from, ending = mic.result()
    return Run(service, speaker, ear, context, received, errors, mic_from, time.monotonic() - ending)


def kinds(run: Run) -> list[str]:
    return [event["type"] for event in run.received]


def test_pipecat_live_pipeline_hears_the_echo(echo_server, caller, assert_echoed, monkeypatch):
    before, mark = echo_server.ended("live"), len(echo_server.log)
    run = run_asyncio(converse(echo_server.ws_url, caller, monkeypatch))

    # Nothing went wrong on either side: no error event, no pipeline error, nothing in the server's log.
    assert not run.errors, run.errors
    assert "error" not in kinds(run), [event for event in run.received if event["type"] == "error"]
    assert echo_server.problems_since(mark) == []

    # The opening: session.start first (client delegation, no audio format: Pipecat assumes 24 kHz PCM16),
    # answered with session.started and its session resource (Pipecat drops one without it).
    (start,) = run.service.sent_of("session.start")
    assert run.service.sent[0][1] is start and start["session"]["delegation"] == {"type": "client"}
    started = [event for event in run.received if event["type"] == "session.started"]
    assert len(started) == 1 and started[0]["session"]["id"] and started[0]["client_event_id"] == start["event_id"]
    assert run.service.sent_of("session.input_audio.append")

    # What came back is the caller's speech, both utterances, after Pipecat's 16 → 24 kHz resampling.
    audio = samples(bytes(run.speaker.audio))
    assert_echoed(caller.first, audio)
    assert_echoed(caller.second, audio)
    # The echo comes one 80 ms frame after the caller spoke, not all of it at the end.
    pieces = assert_echoed(caller.first, audio[int(run.mic_from * RATE) :])
    assert pieces[0].at < 0.5, pieces

    # Text: the echo's frame numbers, every frame's, in order from the first.
    numbers = [int(piece) for piece in run.speaker.text]
    assert numbers == list(range(len(numbers))) and len(numbers) >= run.speaker.frames - 2, numbers

    # A clean close: the EndFrame sent session.close, the server answered session.closed (usage: the
    # session's length) and closed the socket with 1000, and ended the conversation as completed.
    (close,) = run.service.sent_of("session.close")
    closed = [event for event in run.received if event["type"] == "session.closed"]
    assert len(closed) == 1 and closed[0]["reason"] == "close_requested", closed
    assert closed[0]["client_event_id"] == close["event_id"]
    assert abs(closed[0]["usage"]["seconds"] - len(run.speaker.audio) / 2 / RATE) < 0.25
    assert run.end_took < 1.0, run.end_took
    (socket,) = run.service.sockets
    assert socket.close_code == 1000
    echo_server.wait_closed("live", before, outcome="completed")
    logger.info(
        "pipecat live: %d audio frames, %d text pieces, end in %.3f s", run.speaker.frames, len(numbers), run.end_took
    )


def test_pipecat_live_with_persona_and_opening_instruction(echo_server, caller, assert_echoed, monkeypatch):
    """The persona goes in as the session's instructions; the opening instruction (a trailing developer message)
    comes after session.started as session.commentary.append, which the server refuses with an error event that
    Pipecat takes as a non-fatal pipeline error: the call goes on."""
    before, mark = echo_server.ended("live"), len(echo_server.log)
    line = dataclasses.replace(caller, second=caller.second[:0], pause=0.0)  # one utterance
    run = run_asyncio(converse(echo_server.ws_url, line, monkeypatch, persona=PERSONA, opening="Say hello!"))

    (start,) = run.service.sent_of("session.start")
    assert start["session"]["instructions"] == PERSONA and "input" not in start["session"]
    (started,) = [event for event in run.received if event["type"] == "session.started"]
    assert started["session"]["instructions"] == PERSONA

    (commentary,) = run.service.sent_of("session.commentary.append")
    assert commentary["content"] == "Say hello!"
    errors = [event for event in run.received if event["type"] == "error"]
    assert [(e["error"]["code"], e["client_event_id"]) for e in errors] == [
        ("unsupported_event", commentary["event_id"])
    ]
    assert kinds(run).index("error") > kinds(run).index("session.started")
    assert [frame.fatal for frame in run.errors] == [False], run.errors
    assert echo_server.problems_since(mark) == []  # a refused event is the client's, not the server's problem

    assert_echoed(caller.first, samples(bytes(run.speaker.audio)))
    numbers = [int(piece) for piece in run.speaker.text]
    assert numbers == list(range(len(numbers))) and numbers
    assert [event["reason"] for event in run.received if event["type"] == "session.closed"] == ["close_requested"]
    (socket,) = run.service.sockets
    assert socket.close_code == 1000
    echo_server.wait_closed("live", before, outcome="completed")


def test_pipecat_live_hears_the_callers_words(hearing_server, caller, monkeypatch):
    """A server that transcribes sends the caller's words (Live has no opt-in); Pipecat groups the fragments into
    the caller's turn: ``InterimTranscriptionFrame``s as they come, then a ``TranscriptionFrame`` of the whole
    turn, which the user's context aggregator takes into the context as the user's message."""
    line = dataclasses.replace(caller, second=caller.second[:0], pause=0.0)  # one utterance
    run = run_asyncio(converse(hearing_server.ws_url, line, monkeypatch))
    assert not run.errors, run.errors
    assert "error" not in kinds(run)
    assert hearing_server.problems == []

    # The server's fragments, each stamped with the 80 ms frame where it was said.
    deltas = [event for event in run.received if event["type"] == "session.input_transcript.delta"]
    assert [d["delta"] for d in deltas] == hearing_server.heard
    assert all(d["end_ms"] - d["start_ms"] == 80 for d in deltas)

    # Pipecat's frames: the turn so far as each fragment came, then the whole turn.
    assert run.ear.interim and run.ear.interim[-1].text.strip() == hearing_server.heard_text
    assert [frame.text.strip() for frame in run.ear.final] == [hearing_server.heard_text]

    # The user's context aggregator took the turn into the conversation.
    said = [m["content"] for m in run.context.get_messages() if m.get("role") == "user"]
    assert any(hearing_server.heard_text in json.dumps(content) for content in said), run.context.get_messages()
