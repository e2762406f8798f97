"""Bridge a telephone line to pplex-trio: 8 kHz G.711 μ-law both ways, as phone gateways carry it.

    pplex-trio serve --model tiny                      # in another terminal
    python examples/telephony_bridge.py caller.wav reply.wav --url http://127.0.0.1:8998

Telephony gateways (SIP trunks, Twilio Media Streams and the like) deliver the
caller as base64 μ-law at 8 kHz in 20 ms frames, and take the reply the same
way.  pplex-trio speaks that format itself (``audio/pcmu``; beta clients say
``g711_ulaw``), resampling to and from the model's 24 kHz, so a bridge only
moves bytes: here a wav file stands in for the caller, and the reply is
written as μ-law decoded to a wav.  Replace ``caller_frames`` and ``play`` with
your gateway's socket.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import wave
from collections.abc import Iterator

import numpy as np
import soxr  # installed with pplex-trio
from openai import AsyncOpenAI

from pplex_trio.codec import ulaw_decode, ulaw_encode

PHONE_RATE = 8_000
FRAME = PHONE_RATE * 20 // 1000  # 20 ms of μ-law: 160 bytes, a telephone packet


def caller_frames(path: str) -> Iterator[bytes]:
    """The caller's side of the line: μ-law frames of 20 ms (then 2 s of silence to hear the end of the reply)."""
    with wave.open(path) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels()).mean(axis=1)
        rate = w.getframerate()
    line = soxr.resample(pcm.astype(np.float32) / 32768, rate, PHONE_RATE)
    line = np.concatenate([line, np.zeros(2 * PHONE_RATE, np.float32)])
    for i in range(0, line.size - FRAME + 1, FRAME):
        yield ulaw_encode(line[i : i + FRAME])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("caller")
    parser.add_argument("reply")
    parser.add_argument("--url", default="http://127.0.0.1:8998")
    parser.add_argument("--persona", default="You answer the phone for a bakery. Be brief and warm.")
    args = parser.parse_args()

    base = args.url.rstrip("/") + "/v1"
    client = AsyncOpenAI(
        api_key=os.environ.get("PPLEX_TRIO_AUTH_TOKEN", "unused"),
        base_url=base,
        websocket_base_url=base.replace("http", "ws", 1),
    )
    to_phone: list[bytes] = []

    def play(mulaw: bytes) -> None:  # your gateway: send the bytes back down the line
        to_phone.append(mulaw)

    async with client.realtime.connect(model="personaplex") as connection:
        await connection.session.update(
            session={
                "type": "realtime",
                "instructions": args.persona,
                "audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcmu"}}},
            }
        )
        # Start the conversation as the call is answered, and forward the caller once it is live: the model
        # takes its persona in first (seconds on a CPU), and audio sent before that is not heard.
        await connection.response.create()
        async for event in connection:
            if event.type == "response.created":
                break
            if event.type == "error":
                raise SystemExit(f"server: {event.error.message}")

        async def from_phone() -> None:
            loop = asyncio.get_running_loop()
            start = loop.time()
            for n, frame in enumerate(caller_frames(args.caller)):
                await connection.input_audio_buffer.append(audio=base64.b64encode(frame).decode())
                await asyncio.sleep(max(0.0, start + (n + 1) * 0.02 - loop.time()))

        async def to_line() -> None:
            async for event in connection:
                if event.type == "response.output_audio.delta":
                    play(base64.b64decode(event.delta))
                elif event.type == "input_audio_buffer.speech_started":
                    pass  # the caller started talking: a bridge could stop playing what is queued here
                elif event.type == "error":
                    raise SystemExit(f"server: {event.error.message}")

        listener = asyncio.create_task(to_line())
        await from_phone()
        listener.cancel()
    await client.close()
    reply = ulaw_decode(b"".join(to_phone))
    with wave.open(args.reply, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(PHONE_RATE)
        w.writeframes((np.clip(reply, -1, 32767 / 32768) * 32768).astype("<i2").tobytes())
    print(f"wrote {args.reply}: {reply.size / PHONE_RATE:.1f} s of the reply at 8 kHz")


if __name__ == "__main__":
    asyncio.run(main())
