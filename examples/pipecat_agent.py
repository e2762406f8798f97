"""A Pipecat voice agent talking to pplex-trio through Pipecat's OpenAI Realtime service.

    pip install "pipecat-ai[openai]"
    pplex-trio serve --model tiny                      # in another terminal
    python examples/pipecat_agent.py question.wav answer.wav --url http://127.0.0.1:8998

What points Pipecat's ``OpenAIRealtimeLLMService`` at pplex-trio instead of OpenAI:

    OpenAIRealtimeLLMService(
        api_key="placeholder",                  # or the server's token, if it has one
        base_url="ws://127.0.0.1:8998/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(
            model="personaplex",                # any name: the server has one model
            system_instruction="You are ...",   # the persona
            session_properties=SessionProperties(audio=AudioConfiguration(
                output=AudioOutput(voice="NATF2.pt")))),  # a voice of GET /api/voices, or alloy, marin, ...
    )

Here a wav file stands in for the microphone (fed at 16 kHz in 20 ms frames, as
Pipecat's transports deliver audio) and the answer is written to a wav file; in
a bot, put your transport's ``input()`` and ``output()`` where they are. The
model listens and speaks at once, so the answer is as long as the question plus
a 2 s tail. Set PPLEX_TRIO_AUTH_TOKEN if the server has a token.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import wave

import numpy as np
import soxr  # installed with pplex-trio
from pipecat.frames.frames import EndFrame, Frame, InputAudioRawFrame, LLMRunFrame, TTSAudioRawFrame, TTSTextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.events import AudioConfiguration, AudioOutput, SessionProperties
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

log = logging.getLogger("pipecat_agent")

MIC_RATE = 16_000  # what Pipecat's transports deliver; the service resamples to the model's 24 kHz
MODEL_RATE = 24_000
CHUNK = MIC_RATE * 20 // 1000  # 20 ms


def read_wav(path: str, rate: int) -> np.ndarray:
    with wave.open(path) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels()).mean(axis=1)
        return soxr.resample(pcm.astype(np.float32) / 32768, w.getframerate(), rate)


class Loudspeaker(FrameProcessor):
    """Where the transport's output would be: keeps the model's audio and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.audio = bytearray()
        self.transcript: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio += frame.audio
        elif isinstance(frame, TTSTextFrame):
            self.transcript.append(frame.text)
        await self.push_frame(frame, direction)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--url", default="http://127.0.0.1:8998")
    parser.add_argument("--persona", default="You are a friendly assistant. Keep your answers short.")
    parser.add_argument("--voice", default="NATF2.pt")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    llm = OpenAIRealtimeLLMService(
        api_key=os.environ.get("PPLEX_TRIO_AUTH_TOKEN", "placeholder"),
        base_url=args.url.replace("http", "ws", 1).rstrip("/") + "/v1/realtime",  # (https → wss)
        settings=OpenAIRealtimeLLMService.Settings(
            model="personaplex",
            system_instruction=args.persona,
            session_properties=SessionProperties(audio=AudioConfiguration(output=AudioOutput(voice=args.voice))),
        ),
    )
    # PersonaPlex hears audio only: the persona above is all the text it takes, so the context starts empty.
    user, assistant = LLMContextAggregatorPair(LLMContext())
    speaker = Loudspeaker()
    worker = PipelineWorker(
        Pipeline([user, llm, speaker, assistant]),
        params=PipelineParams(audio_in_sample_rate=MIC_RATE),
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)

    async def microphone() -> None:
        await worker.queue_frames([LLMRunFrame()])  # start the conversation
        question = np.concatenate([read_wav(args.input, MIC_RATE), np.zeros(2 * MIC_RATE, np.float32)])
        pcm = (np.clip(question, -1, 32767 / 32768) * 32768).astype("<i2")
        loop = asyncio.get_running_loop()
        start = loop.time()
        for n in range(pcm.size // CHUNK):  # in real time, as a microphone would
            frame = pcm[n * CHUNK : (n + 1) * CHUNK].tobytes()
            await worker.queue_frame(InputAudioRawFrame(audio=frame, sample_rate=MIC_RATE, num_channels=1))
            await asyncio.sleep(max(0.0, start + (n + 1) * CHUNK / MIC_RATE - loop.time()))
        await worker.queue_frame(EndFrame())  # hang up: the service closes its connection

    talking = asyncio.create_task(microphone())
    await runner.run()
    await talking

    with wave.open(args.output, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(MODEL_RATE)
        w.writeframes(bytes(speaker.audio))
    log.info(
        "wrote %s (%.1f s); transcript: %r",
        args.output,
        len(speaker.audio) / 2 / MODEL_RATE,
        "".join(speaker.transcript),
    )


if __name__ == "__main__":
    asyncio.run(main())
