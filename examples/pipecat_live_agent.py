"""A Pipecat voice agent talking to pplex-trio through Pipecat's OpenAI Live service (``gpt-live``).

    pip install "pipecat-ai[openai]"
    pplex-trio serve --model tiny                      # in another terminal
    python examples/pipecat_live_agent.py question.wav answer.wav --url http://127.0.0.1:8998

What points Pipecat's ``OpenAILiveLLMService`` at pplex-trio instead of OpenAI:

    OpenAILiveLLMService(
        api_key="placeholder",                         # or the server's token, if it has one
        base_url="ws://127.0.0.1:8998/v1/live/sessions",  # the whole URL: Pipecat adds nothing to it
        settings=OpenAILiveLLMService.Settings(
            system_instruction="You are ...",          # the persona
            voice="NATF2.pt",                          # a voice of GET /api/voices, or marin, cedar, ...
        ),
    )                                                  # delegation: leave it out (PersonaPlex has no backend)

The Live protocol has no turns: the model listens and speaks at once, and its
audio streams continuously, silence included, so the answer is as long as the
question plus a 2 s tail. The session starts on the first context frame (the
``LLMRunFrame`` below) and the service drops microphone audio until the server
says the session has started: the microphone here waits for
``on_session_started``, as a caller waits for the call to connect. PersonaPlex
takes no text besides its persona, so leave the context empty: an opening
instruction (a trailing developer message) would be sent as
``session.commentary.append``, which the server refuses with an error event.

Here a wav file stands in for the microphone (fed at 16 kHz in 20 ms frames, as
Pipecat's transports deliver audio) and the answer is written to a wav file; in
a bot, put your transport's ``input()`` and ``output()`` where they are. Set
PPLEX_TRIO_AUTH_TOKEN if the server has a token.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import wave

import numpy as np
import soxr  # installed with pplex-trio
from pipecat.frames.frames import EndFrame, Frame, InputAudioRawFrame, LLMRunFrame, OutputAudioRawFrame, TTSTextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from pipecat.workers.runner import WorkerRunner

log = logging.getLogger("pipecat_live_agent")

MIC_RATE = 16_000  # what Pipecat's transports deliver; the service resamples to the model's 24 kHz
MODEL_RATE = 24_000
CHUNK = MIC_RATE * 20 // 1000  # 20 ms


def read_wav(path: str, rate: int) -> np.ndarray:
    with wave.open(path) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels()).mean(axis=1)
        return soxr.resample(pcm.astype(np.float32) / 32768, w.getframerate(), rate)


class Loudspeaker(FrameProcessor):
    """Where the transport's output would be: keeps the model's audio (silence included) and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.audio = bytearray()
        self.transcript: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputAudioRawFrame):  # the Live service's speech stream
            self.audio += frame.audio
        elif isinstance(frame, TTSTextFrame):  # its transcript, a fragment at a time (with their own spaces)
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

    llm = OpenAILiveLLMService(
        api_key=os.environ.get("PPLEX_TRIO_AUTH_TOKEN", "placeholder"),
        base_url=args.url.replace("http", "ws", 1).rstrip("/") + "/v1/live/sessions",  # (https → wss)
        settings=OpenAILiveLLMService.Settings(system_instruction=args.persona, voice=args.voice),
    )
    user, assistant = LLMContextAggregatorPair(LLMContext())
    speaker = Loudspeaker()
    worker = PipelineWorker(
        Pipeline([user, llm, speaker, assistant]),
        params=PipelineParams(audio_in_sample_rate=MIC_RATE),
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    connected = asyncio.Event()

    @llm.event_handler("on_session_started")
    async def on_session_started(_llm: OpenAILiveLLMService, session: object) -> None:
        connected.set()

    async def microphone() -> None:
        await worker.queue_frames([LLMRunFrame()])  # start the session
        try:
            await asyncio.wait_for(connected.wait(), 30)  # the caller talks once the call is up
            question = np.concatenate([read_wav(args.input, MIC_RATE), np.zeros(2 * MIC_RATE, np.float32)])
            pcm = (np.clip(question, -1, 32767 / 32768) * 32768).astype("<i2")
            loop = asyncio.get_running_loop()
            start = loop.time()
            for n in range(pcm.size // CHUNK):  # in real time, as a microphone would
                frame = pcm[n * CHUNK : (n + 1) * CHUNK].tobytes()
                await worker.queue_frame(InputAudioRawFrame(audio=frame, sample_rate=MIC_RATE, num_channels=1))
                await asyncio.sleep(max(0.0, start + (n + 1) * CHUNK / MIC_RATE - loop.time()))
        finally:
            await worker.queue_frame(EndFrame())  # hang up: session.close, then the server's session.closed

    talking = asyncio.create_task(microphone())
    await runner.run()
    if not talking.done():  # the pipeline ended on its own: an error, logged above
        talking.cancel()
        raise SystemExit("the pipeline ended before the call did")
    talking.result()

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
