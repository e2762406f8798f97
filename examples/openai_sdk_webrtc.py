"""Call pplex-trio over WebRTC from Python: aiortc for the call, the official OpenAI SDK for its offer.

    pplex-trio serve --model tiny                      # in another terminal
    python examples/openai_sdk_webrtc.py question.wav answer.wav --url http://127.0.0.1:8998

OpenAI's WebRTC flow, as a browser runs it: a peer connection with the microphone (here a wav file, played in
real time, then two seconds of silence to answer in) and the ``oai-events`` data channel; its offer posted with
``client.realtime.calls.create(sdp=..., session=...)``; the answer applied. The model's voice comes back on the
remote track (written to the output wav, 24 kHz), its words on the data channel (printed). Set
PPLEX_TRIO_AUTH_TOKEN if the server has a token.
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import json
import os
import wave

import av
import numpy as np
import soxr  # installed with pplex-trio
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from openai import AsyncOpenAI

RATE = 48_000  # WebRTC's Opus
PACKET = RATE // 50  # 20 ms


class WavMicrophone(MediaStreamTrack):
    """A wav file as a microphone: 20 ms frames in real time, then silence."""

    kind = "audio"

    def __init__(self, pcm: np.ndarray) -> None:
        super().__init__()
        self.pcm = np.round(np.clip(pcm, -1, 1) * 32767).astype(np.int16)
        self.sent = 0
        self.start: float | None = None

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        self.start = self.start or loop.time()
        await asyncio.sleep(max(0.0, self.start + self.sent / RATE - loop.time()))
        piece = self.pcm[self.sent : self.sent + PACKET]
        piece = np.pad(piece, (0, PACKET - piece.size))
        frame = av.AudioFrame.from_ndarray(np.repeat(piece, 2).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self.sent, fractions.Fraction(1, RATE)
        self.sent += PACKET
        return frame


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

    question = read_wav(args.input)
    seconds = question.size / RATE + 2  # the question, and a tail to answer in
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(WavMicrophone(question))
    events = pc.createDataChannel("oai-events")
    transcript: list[str] = []
    heard: list[np.ndarray] = []

    @events.on("message")
    def on_event(message: str) -> None:
        event = json.loads(message)
        if event["type"] == "response.output_audio_transcript.delta":
            transcript.append(event["delta"])

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        async def listen() -> None:
            while sum(piece.size for piece in heard) < seconds * RATE:
                frame = await track.recv()
                heard.append(frame.to_ndarray().reshape(-1, 2)[:, 0])  # (the voice is on both channels)

        asyncio.ensure_future(listen())

    await pc.setLocalDescription(await pc.createOffer())
    client = AsyncOpenAI(api_key=os.environ.get("PPLEX_TRIO_AUTH_TOKEN", "unused"), base_url=args.url + "/v1")
    session = {"type": "realtime", "instructions": args.persona, "audio": {"output": {"voice": args.voice}}}
    answer = await client.realtime.calls.create(sdp=pc.localDescription.sdp, session=session)
    await pc.setRemoteDescription(RTCSessionDescription(answer.text, "answer"))
    print("call:", answer.response.headers["location"])
    while sum(piece.size for piece in heard) < seconds * RATE:
        await asyncio.sleep(0.1)
    await pc.close()

    voice = soxr.resample(np.concatenate(heard).astype(np.float32) / 32768, RATE, 24_000)
    with wave.open(args.output, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24_000)
        w.writeframes((np.clip(voice, -1, 1) * 32767).astype("<i2").tobytes())
    print(f"wrote {voice.size / 24_000:.1f} s to {args.output}; transcript: {''.join(transcript)!r}")


if __name__ == "__main__":
    asyncio.run(main())
