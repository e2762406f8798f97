"""A greedy raw conversation with the tiny model over the server, and the same conversation straight
through the engine: the pair the tiny-model server tests compare."""

import json

import numpy as np
import trio

from _helpers.ws import FRAME, raw_open
from pplex_trio.engine import SlotMode

GREEDY = {"text_temperature": 0, "audio_temperature": 0}
FRAMES = 25


async def raw_conversation(handle, frames, **params):
    """Stream `frames` (three ahead, then one per tick) and collect every output frame and text piece."""
    pcm, texts = [], []
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws, timeout=60, **params)

        async def send():
            for i, frame in enumerate(frames):
                await ws.send_message(frame.astype("<f4").tobytes())
                if i >= 2:
                    await trio.sleep(FRAME / 24000)
            await ws.send_message(json.dumps({"type": "close"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            with trio.fail_after(60):
                while True:
                    message = await ws.get_message()
                    if isinstance(message, bytes):
                        pcm.append(np.frombuffer(message, "<f4"))
                    else:
                        event = json.loads(message)
                        if event["type"] == "done":
                            break
                        texts.append(event["text"])
    return np.stack(pcm), texts


def direct_run(engine, conversation, frames, lead_silence):
    """The same conversation driven straight through the engine, slot 0 alone."""
    engine.reset_all()
    steps = engine.start(0, conversation)
    engine.prefill({0: steps})
    out = []
    inputs = [np.zeros(FRAME, np.float32)] * lead_silence + list(frames)
    for frame in inputs:
        batch = np.zeros((2, FRAME), np.float32)
        batch[0] = frame
        out.append(engine.step([SlotMode.LIVE, SlotMode.IDLE], batch).pcm[0].copy())
    return np.stack(out)
