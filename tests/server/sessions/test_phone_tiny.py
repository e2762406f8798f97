"""A phone call to the tiny model on each carrier's endpoint: the caller's speech in, the model's voice out.

The echo tests (``test_twilio.py``, ``test_carriers.py``) check the audio
sample by sample; here the real engine answers (random weights: its voice is
noise), with the persona and voice the answer document hands the stream.
Each carrier's own Pipecat serializer checks what we send as the carrier;
what comes back is decoded here (CPython's ``audioop`` for μ-law).  The real
server on the virtual network and clock, the engine's calls inline.
"""

from __future__ import annotations

import wave

import numpy as np
import pytest
import soxr
import trio

from _helpers.carriers import WIRES, CarrierCall
from _helpers.twilio import PATH as TWILIO_PATH
from _helpers.twilio import TwilioCall, float_to_ulaw, ulaw_to_float

RATE = 8_000
SECONDS = 2


def speech_8k(path) -> np.ndarray:
    with wave.open(str(path)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    return soxr.resample(pcm, w.getframerate(), RATE).astype(np.float32)[3 * RATE : (3 + SECONDS) * RATE]


class TwilioAsCarrier:
    """``TwilioCall`` with the few calls of ``CarrierCall`` this test makes."""

    path = TWILIO_PATH

    def __init__(self, ws):
        self.call = TwilioCall(ws, check=True)

    async def open(self, **parameters: str) -> None:
        await self.call.open(**parameters)

    async def talk(self, pcm: np.ndarray) -> None:
        deadline = trio.current_time()
        for i in range(0, pcm.size, 160):  # 20 ms a message, as Twilio sends
            await self.call.media(float_to_ulaw(pcm[i : i + 160]))
            deadline += 0.02
            await trio.sleep_until(deadline)

    async def listen(self) -> None:
        await self.call.listen()

    async def hang_up(self) -> tuple[int, str | None]:
        await self.call.stop()
        return await self.call.until_closed()

    def media_count(self) -> int:
        return len(self.call.of("media"))

    def audio(self) -> np.ndarray:
        return ulaw_to_float(self.call.audio())


class OtherCarrier:
    def __init__(self, ws, name: str):
        self.wire = WIRES[name]
        self.path = self.wire.path
        self.call = CarrierCall(self.wire, ws, check=True)

    async def open(self, **parameters: str) -> None:
        await self.call.open(**parameters)

    async def talk(self, pcm: np.ndarray) -> None:
        await self.call.talk(pcm)

    async def listen(self) -> None:
        await self.call.listen()

    async def hang_up(self) -> tuple[int, str | None]:
        await self.call.send(self.wire.stop())
        return await self.call.until_closed()

    def media_count(self) -> int:
        return len(self.call.of(self.wire.media))

    def audio(self) -> np.ndarray:
        return self.call.audio()


@pytest.mark.parametrize("carrier", ["twilio", *WIRES])
async def test_a_phone_call_reaches_the_tiny_model_and_hears_its_voice(
    virtual_server, autojump_clock, engine, speech_wav, carrier
):
    handle = await virtual_server(engine, slots=2)
    path = TWILIO_PATH if carrier == "twilio" else WIRES[carrier].path
    async with handle.open_websocket(handle.ws_url + path) as ws:
        call = TwilioAsCarrier(ws) if carrier == "twilio" else OtherCarrier(ws, carrier)
        await call.open(persona="You answer the phone for a bakery.", voice="NATM0.pt")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.listen)
            await call.talk(speech_8k(speech_wav))
            await trio.sleep(0.5)
            session = (await handle.get_json("/api/sessions"))["sessions"][0]
            nursery.cancel_scope.cancel()
        assert session["state"] == "live" and session["frames_consumed"] >= SECONDS / 0.08 - 2
        code, _ = await call.hang_up()
        assert code == 1000
        while (await handle.get_json("/health"))["slots_free"] != 2:  # the hang-up frees the slot at once
            await trio.sleep(0.001)
    frames = call.media_count()
    assert abs(frames - (SECONDS + 0.5) / 0.08) <= 3  # a frame of the model's voice every 80 ms
    audio = call.audio()
    # 80 ms of 8 kHz audio each, give or take the resampler's block and a carrier's whole 20 ms chunks (Exotel)
    assert abs(audio.size - frames * 640) <= 640 + 160
    assert np.sqrt(np.mean(audio[-RATE:] ** 2)) > 1e-3  # the model speaks (its random weights: noise)
    assert f'pplex_sessions_ended_total{{outcome="hangup",protocol="{carrier}"}} 1.0' in await handle.metrics()
