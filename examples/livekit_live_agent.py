"""A LiveKit agent on pplex-trio through the OpenAI plugin's GPT-Live model (the Live protocol, ``gpt-live``).

    pip install livekit-agents livekit-plugins-openai
    pplex-trio serve --model tiny                      # in another terminal
    python examples/livekit_live_agent.py question.wav answer.wav --url http://127.0.0.1:8998

The model an agent hands to ``AgentSession(llm=...)``:

    openai.realtime.GPTLiveModel(
        base_url="http://127.0.0.1:8998/v1",   # the plugin adds /live/sessions
        api_key="placeholder",                 # or the server's token, if it has one
        delegation="client",                   # PersonaPlex has no Responses backend for the default
        voice="NATF2.pt",                      # or leave the default (marin): the server maps it
    )                                          # the persona: the agent's instructions

``GPTLiveModel`` is a duplex model: it listens and speaks at once and decides
for itself when to talk, and the session plays its output while it is audible.
PersonaPlex takes no text besides its persona: ``generate_reply()`` and the
plugin's ``append_*`` send text the server refuses (an ``error`` event the
plugin reports as recoverable; ``generate_reply`` is answered only by the
model's next speech, or fails after 10 s). ``agent.duplex_session.mute_input()``
and ``unmute_input()`` work: while muted the model hears silence.

In an agent, LiveKit moves the room's audio. To run without a LiveKit server,
this script gives the session its own audio I/O: the wav file is the room's
48 kHz microphone track, in real time from the moment the call is up, and what
the session plays is written to a wav file (24 kHz) at the moment it played,
silence in between, so the answer is as long as the question plus a 2 s tail.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
import wave

import aiohttp
import numpy as np
import soxr  # installed with pplex-trio
from livekit import rtc
from livekit.agents import Agent, AgentSession, llm
from livekit.agents.voice import io
from livekit.plugins import openai

log = logging.getLogger("livekit_live_agent")

ROOM_RATE = 48_000  # what a LiveKit room's audio track carries; the plugin resamples for the model
MODEL_RATE = 24_000
CHUNK = ROOM_RATE * 10 // 1000  # 10 ms, a WebRTC frame


def read_wav(path: str, rate: int) -> np.ndarray:
    with wave.open(path) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels()).mean(axis=1)
        return soxr.resample(pcm.astype(np.float32) / 32768, w.getframerate(), rate)


class WavMicrophone(io.AudioInput):
    """The wav file as a room's microphone track, in real time from ``live`` on, then silence."""

    def __init__(self, audio: np.ndarray, live: asyncio.Event) -> None:
        super().__init__(label="wav microphone")
        self._pcm = (np.clip(audio, -1, 32767 / 32768) * 32768).astype("<i2")
        self._live = live
        self._next = 0
        self._start = 0.0
        self.done = asyncio.Event()  # the whole file has gone out

    async def __anext__(self) -> rtc.AudioFrame:
        if self._next == 0:
            await self._live.wait()
            self._start = time.monotonic()
        n, self._next = self._next, self._next + 1
        await asyncio.sleep(max(0.0, self._start + n * CHUNK / ROOM_RATE - time.monotonic()))
        chunk = self._pcm[n * CHUNK : (n + 1) * CHUNK]
        if chunk.size < CHUNK:
            self.done.set()
            chunk = np.zeros(CHUNK, "<i2")
        return rtc.AudioFrame(data=chunk.tobytes(), sample_rate=ROOM_RATE, num_channels=1, samples_per_channel=CHUNK)


class WavLoudspeaker(io.AudioOutput):
    """What the session plays, placed on the call's timeline (silence where nothing played)."""

    def __init__(self) -> None:
        super().__init__(
            label="wav loudspeaker", capabilities=io.AudioOutputCapabilities(pause=False), sample_rate=MODEL_RATE
        )
        self.audio = bytearray()
        self.start: float | None = None  # when the call went live
        self._pushed = 0.0  # of the segment playing

    def pad_to_now(self) -> None:
        assert self.start is not None
        behind = round((time.monotonic() - self.start) * MODEL_RATE) * 2 - len(self.audio)
        self.audio += bytes(max(0, behind))

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._pushed:  # a segment starts: it plays from now on (the model's audio comes in real time)
            if self.start is not None:
                self.pad_to_now()
            self.on_playback_started(created_at=time.time())
        self._pushed += frame.duration
        self.audio += frame.data.tobytes()

    def flush(self) -> None:
        super().flush()
        if self._pushed:
            self.on_playback_finished(playback_position=self._pushed, interrupted=False)
            self._pushed = 0.0

    def clear_buffer(self) -> None:
        if self._pushed:
            self.on_playback_finished(playback_position=self._pushed, interrupted=True)
            self._pushed = 0.0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--url", default="http://127.0.0.1:8998")
    parser.add_argument("--persona", default="You are a friendly assistant. Keep your answers short.")
    parser.add_argument("--voice", help="a voice of GET /api/voices (default: the plugin's own)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    transcript: list[str] = []
    question = np.concatenate([read_wav(args.input, ROOM_RATE), np.zeros(2 * ROOM_RATE, np.float32)])

    async with aiohttp.ClientSession() as http:
        voice = {"voice": args.voice} if args.voice else {}
        model = openai.realtime.GPTLiveModel(
            base_url=args.url.rstrip("/") + "/v1",
            delegation="client",
            api_key=os.environ.get("PPLEX_TRIO_AUTH_TOKEN", "placeholder"),
            http_session=http,
            **voice,
        )
        # The microphone is a file: there is no echo of the loudspeaker for LiveKit's AEC warm-up to wait out.
        session = AgentSession(llm=model, aec_warmup_duration=None)
        live = asyncio.Event()
        microphone, speaker = WavMicrophone(question, live), WavLoudspeaker()
        session.input.audio, session.output.audio = microphone, speaker

        def on_item(event: llm.ChatItem) -> None:  # what the model said, as the session records it
            if isinstance(event, llm.ChatMessage) and event.role == "assistant":
                transcript.append(event.text_content or "")

        session.on("conversation_item_added", lambda event: on_item(event.item))
        session.on("error", lambda event: log.error("model error: %s", event.error))
        agent = Agent(instructions=args.persona)
        await session.start(agent)

        # The caller talks once the call is up: when the server has started the session.
        duplex = agent.duplex_session
        duplex.on(
            "openai_server_event_received", lambda event: live.set() if event.get("type") == "session.started" else None
        )
        if duplex.session_id is not None:  # (it may have started already)
            live.set()
        await asyncio.wait_for(live.wait(), 30)
        speaker.start = time.monotonic()

        await microphone.done.wait()
        await session.aclose()  # hang up: session.close, then the server's session.closed
        speaker.pad_to_now()

    with wave.open(args.output, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(MODEL_RATE)
        w.writeframes(bytes(speaker.audio))
    log.info("wrote %s (%.1f s); transcript: %r", args.output, len(speaker.audio) / 2 / MODEL_RATE, "".join(transcript))


if __name__ == "__main__":
    asyncio.run(main())
