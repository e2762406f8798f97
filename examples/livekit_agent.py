"""A LiveKit agent's realtime model on pplex-trio: the OpenAI plugin, or LiveKit's PersonaPlex plugin.

    pip install livekit-agents livekit-plugins-openai livekit-plugins-nvidia
    pplex-trio serve --model tiny                      # in another terminal
    python examples/livekit_agent.py question.wav answer.wav --plugin openai --url http://127.0.0.1:8998
    python examples/livekit_agent.py question.wav answer.wav --plugin personaplex --url http://127.0.0.1:8998

The two models an agent can hand to ``AgentSession(llm=...)``:

    # OpenAI's Realtime protocol, on /v1/realtime
    openai.realtime.RealtimeModel(
        base_url="http://127.0.0.1:8998/v1",   # the plugin adds /realtime?model=...
        api_key="placeholder",                 # or the server's token, if it has one
        model="personaplex",                   # any name: the server has one model
        voice="NATF2.pt",                      # or leave OpenAI's default (marin): the server maps it
    )                                          # the persona: the agent's instructions

    # The Moshi protocol, on /api/chat, as NVIDIA's own PersonaPlex server speaks it
    # (from livekit.plugins.nvidia.experimental import realtime as personaplex)
    personaplex.RealtimeModel(
        base_url="ws://127.0.0.1:8998",        # a server without a token: this plugin cannot send one
        voice="NATF2",                         # the plugin adds .pt
        text_prompt="You are ...",             # the persona; a new one makes the plugin reconnect
        seed=42,                               # optional: the same seed and input give the same answer
        http_session=aiohttp.ClientSession(),  # outside an agent job, the plugin needs one given
    )

In an agent, LiveKit moves the room's audio. To run without a LiveKit server,
this script drives the model's session by hand, as ``AgentSession`` does: the
wav file is pushed as a room's 48 kHz microphone track, in real time, and what
the model says is read from its generations and written to a wav file (24 kHz).
The model listens and speaks at once, so the answer is as long as the question
plus a 2 s tail.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import wave

import aiohttp
import numpy as np
import soxr  # installed with pplex-trio
from livekit import rtc
from livekit.agents import llm
from livekit.plugins import openai
from livekit.plugins.nvidia.experimental import realtime as personaplex

log = logging.getLogger("livekit_agent")

ROOM_RATE = 48_000  # what a LiveKit room's audio track carries; the plugins resample for the model
MODEL_RATE = 24_000
CHUNK = ROOM_RATE * 10 // 1000  # 10 ms, a WebRTC frame


def read_wav(path: str, rate: int) -> np.ndarray:
    with wave.open(path) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels()).mean(axis=1)
        return soxr.resample(pcm.astype(np.float32) / 32768, w.getframerate(), rate)


def make_model(args: argparse.Namespace, http: aiohttp.ClientSession) -> llm.RealtimeModel:
    if args.plugin == "openai":
        voice = {"voice": args.voice} if args.voice else {}
        return openai.realtime.RealtimeModel(
            base_url=args.url.rstrip("/") + "/v1",
            model="personaplex",
            api_key=os.environ.get("PPLEX_TRIO_AUTH_TOKEN", "placeholder"),
            http_session=http,
            **voice,
        )
    return personaplex.RealtimeModel(
        base_url=args.url.replace("http", "ws", 1),
        voice=(args.voice or "NATF2").removesuffix(".pt"),
        text_prompt=args.persona,
        seed=42,
        http_session=http,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--plugin", choices=["openai", "personaplex"], default="openai")
    parser.add_argument("--url", default="http://127.0.0.1:8998")
    parser.add_argument("--persona", default="You are a friendly assistant. Keep your answers short.")
    parser.add_argument("--voice", help="a voice of GET /api/voices (default: the plugin's own)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    answer = bytearray()
    transcript: list[str] = []
    readers: list[asyncio.Task[None]] = []

    async def play(generation: llm.GenerationCreatedEvent) -> None:
        """What the agent's loudspeaker and transcript would take: each message's audio and text."""
        async for message in generation.message_stream:

            async def audio(message: llm.MessageGeneration = message) -> None:
                async for frame in message.audio_stream:
                    answer.extend(frame.data)

            async def text(message: llm.MessageGeneration = message) -> None:
                async for piece in message.text_stream:
                    transcript.append(piece)

            await asyncio.gather(audio(), text())

    speaking = asyncio.Event()

    def on_generation(generation: llm.GenerationCreatedEvent) -> None:
        speaking.set()
        readers.append(asyncio.create_task(play(generation)))

    async with aiohttp.ClientSession() as http:
        model = make_model(args, http)
        session = model.session()
        session.on("generation_created", on_generation)
        session.on("error", lambda error: log.error("model error: %s", error.error))
        if args.plugin == "openai":
            await session.update_instructions(args.persona)  # the agent's instructions: the persona
            await session.generate_reply()  # start the conversation (the plugin gives it 10 s)
        # The caller talks once the call is up: when the model speaks (silence, at first). The PersonaPlex
        # plugin would hold earlier audio until the server is ready and then send it all at once.
        await asyncio.wait_for(speaking.wait(), 30)

        question = np.concatenate([read_wav(args.input, ROOM_RATE), np.zeros(2 * ROOM_RATE, np.float32)])
        pcm = (np.clip(question, -1, 32767 / 32768) * 32768).astype("<i2")
        loop = asyncio.get_running_loop()
        start = loop.time()
        for n in range(pcm.size // CHUNK):  # the room's microphone track, in real time
            session.push_audio(
                rtc.AudioFrame(
                    data=pcm[n * CHUNK : (n + 1) * CHUNK].tobytes(),
                    sample_rate=ROOM_RATE,
                    num_channels=1,
                    samples_per_channel=CHUNK,
                )
            )
            await asyncio.sleep(max(0.0, start + (n + 1) * CHUNK / ROOM_RATE - loop.time()))

        await session.aclose()  # hang up
        await asyncio.gather(*readers)
        await model.aclose()

    with wave.open(args.output, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(MODEL_RATE)
        w.writeframes(bytes(answer))
    log.info("wrote %s (%.1f s); transcript: %r", args.output, len(answer) / 2 / MODEL_RATE, "".join(transcript))


if __name__ == "__main__":
    asyncio.run(main())
