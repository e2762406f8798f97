"""An OpenAI-SDK Realtime call that survives a dropped connection (``pip install "openai[realtime]"``).

    pplex-trio serve --model tiny                      # in another terminal
    python examples/openai_sdk_resume.py question.wav answer.wav --url http://127.0.0.1:8998

As ``openai_sdk.py``, and resumable: the call asks for a resume token
(``?resumable=1``), keeps the latest one the server gives (``resume_token`` in
the session of ``session.created`` / ``session.updated``), and when the
connection drops, the SDK reconnects with backoff (its ``on_reconnecting``) to
``?resume=TOKEN``: the same session, the model's memory intact.  Audio is real
time: what would have been said while the connection was down is not sent.
The answer file has the model's voice from before and after the outage.
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
from openai.types.websocket_reconnection import ReconnectingEvent, ReconnectingOverrides

RATE = 24_000
CHUNK = RATE * 80 // 1000  # 80 ms, the model's frame


def read_wav(path: str) -> np.ndarray:
    with wave.open(path) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels()).mean(axis=1)
        return soxr.resample(pcm.astype(np.float32) / 32768, w.getframerate(), RATE)


class Resumable:
    """The call's resume token, kept from the server's session events, and whether the connection is up."""

    def __init__(self) -> None:
        self.token: str | None = None
        self.session_id: str | None = None
        self.up = asyncio.Event()
        self.resumes = 0

    def seen(self, event) -> None:
        """Keep the latest token (the SDK parses it as an extra field of the session)."""
        if event.type in ("session.created", "session.updated"):
            self.token = getattr(event.session, "resume_token", None) or self.token
            if event.type == "session.created" and self.session_id is not None:
                print(f"resumed session {event.session.id} (was {self.session_id})", flush=True)
                self.resumes += 1
            self.session_id = event.session.id
            if self.token is not None:
                self.up.set()

    def reconnecting(self, event: ReconnectingEvent) -> ReconnectingOverrides | None:
        """The SDK's hook before each attempt (it waits ``event.delay``, with backoff): resume with the token."""
        self.up.clear()
        print(f"connection lost (close {event.close_code}); reconnecting, attempt {event.attempt}", flush=True)
        if self.token is None:
            return {"abort": True}  # not live yet: nothing to resume
        return {"extra_query": {"resume": self.token}}


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
    call = Resumable()
    manager = client.realtime.connect(
        model="personaplex",
        extra_query={"resumable": "1"},
        on_reconnecting=call.reconnecting,
        initial_delay=0.5,  # then 1, 2, 4 s...
        max_retries=6,
    )
    async with manager as connection:
        await connection.session.update(
            session={
                "type": "realtime",
                "instructions": args.persona,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}}, "output": {"voice": args.voice}},
            }
        )
        await connection.response.create()  # start the conversation (the model takes in its persona first)

        async def listen() -> None:
            async for event in connection:  # (across reconnections: the SDK's iterator resumes with them)
                call.seen(event)
                if event.type == "response.output_audio.delta":
                    answer.append(base64.b64decode(event.delta))
                elif event.type == "response.output_audio_transcript.delta":
                    transcript.append(event.delta)
                elif event.type == "error":
                    raise SystemExit(f"server: {event.error.message}")

        async def speak() -> None:
            await call.up.wait()
            loop = asyncio.get_running_loop()
            start = loop.time()
            for i in range(0, question.size, CHUNK):
                if call.up.is_set():  # (down: this moment of speech is lost, as on a phone)
                    chunk = (np.clip(question[i : i + CHUNK], -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
                    await connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                await asyncio.sleep(max(0.0, start + (i // CHUNK + 1) * 0.08 - loop.time()))

        listener = asyncio.create_task(listen())
        speaker = asyncio.create_task(speak())
        done, _ = await asyncio.wait({listener, speaker}, return_when=asyncio.FIRST_COMPLETED)
        listener.cancel()
        speaker.cancel()
        for task in done:
            task.result()  # (the listener's SystemExit, or a connection that could not be resumed)
        # pplex-trio's hang-up (OpenAI's Realtime has none): the server frees the call's slot at once.
        await connection.send({"type": "session.close"})  # type: ignore[arg-type]
    await client.close()
    with wave.open(args.output, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(b"".join(answer))
    seconds = sum(map(len, answer)) / 2 / RATE
    print(f"wrote {args.output} ({seconds:.1f} s, resumed {call.resumes}x); transcript: {''.join(transcript)!r}")


if __name__ == "__main__":
    asyncio.run(main())
