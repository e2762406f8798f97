"""Talk to pplex-trio through the official OpenAI SDK (``pip install "openai[realtime]"``).

    pplex-trio serve --model tiny                      # in another terminal
    python examples/openai_sdk.py question.wav answer.wav --url http://127.0.0.1:8998

It streams a wav file to ``/v1/realtime`` in real time, as a microphone would,
and writes what PersonaPlex said (24 kHz PCM16) and prints its transcript.  The
model listens and speaks at once, so the answer is as long as the question plus
a tail.  Set PPLEX_TRIO_AUTH_TOKEN if the server has a token: the SDK sends its
``api_key`` as ``Authorization: Bearer``, which is how the server takes it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import wave

import numpy as np
import soxr  # installed with pplex-trio
from openai import AsyncOpenAI

RATE = 24_000
CHUNK = RATE * 80 // 1000  # 80 ms, the model's frame


def read_wav(path: str) -> np.ndarray:
    with wave.open(path) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels()).mean(axis=1)
        return soxr.resample(pcm.astype(np.float32) / 32768, w.getframerate(), RATE)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--url", default="http://127.0.0.1:8998")
    parser.add_argument("--persona", default="You are a friendly assistant. Keep your answers short.")
    parser.add_argument("--voice", default="NATF2.pt")
    args = parser.parse_args()

    base = args.url.rstrip("/") + "/v1"
    client = AsyncOpenAI(
        api_key=os.environ.get("PPLEX_TRIO_AUTH_TOKEN", "unused"),
        base_url=base,
        websocket_base_url=base.replace("http", "ws", 1),
    )  # (https → wss)
    question = np.concatenate([read_wav(args.input), np.zeros(2 * RATE, np.float32)])  # a 2 s tail to answer in
    answer: list[bytes] = []
    transcript: list[str] = []
    async with client.realtime.connect(model="personaplex") as connection:
        await connection.session.update(
            session={
                "type": "realtime",
                "instructions": args.persona,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}}, "output": {"voice": args.voice}},
            }
        )
        await connection.response.create()  # start the conversation (the model takes in its persona first)
        async for event in connection:
            if event.type == "response.created":
                break
            if event.type == "error":
                raise SystemExit(f"server: {event.error.message}")

        async def speak() -> None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            for i in range(0, question.size, CHUNK):
                chunk = (np.clip(question[i : i + CHUNK], -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
                await connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                await asyncio.sleep(max(0.0, start + (i // CHUNK + 1) * 0.08 - loop.time()))

        async def listen() -> None:
            async for event in connection:
                if event.type == "response.output_audio.delta":
                    answer.append(base64.b64decode(event.delta))
                elif event.type == "response.output_audio_transcript.delta":
                    transcript.append(event.delta)
                elif event.type == "error":
                    raise SystemExit(f"server: {event.error.message}")

        listener = asyncio.create_task(listen())
        await speak()
        listener.cancel()
    await client.close()
    with wave.open(args.output, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(b"".join(answer))
    print(f"wrote {args.output} ({sum(map(len, answer)) / 2 / RATE:.1f} s); transcript: {''.join(transcript)!r}")


if __name__ == "__main__":
    asyncio.run(main())
