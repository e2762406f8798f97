"""Measured from outside, as a new caller sees it: after a network stall the conversation answers as soon after
each frame as it did before (issue 48, item 6; the virtual network and clock, the echo engine).

A raw client sends 16 s of real speech at real time, one 80 ms frame a message, its number in its first sample
(as ``bench/soak.py``'s steady conversation does); the network holds what it sends from 5 s for 1 s, then
delivers it at once.  The grid of ticks starts on its first frame, so each frame is taken as it lands: the echo
(one frame late) plus the engine call (5 ms) is the whole turnaround, 85 ms, before the stall and from 4 s after
it.  Before the fix the catch-up's last tick started early (the early start: the backlog's frames were in), the
frame that landed between it and its deadline waited for the next tick, and so did every frame after it: 158 ms
for the rest of the call.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import sphn
import trio

from _helpers.ws import FRAME, SR, raw_open
from pplex_trio.codec import is_silent
from pplex_trio.server import ServerSettings

TAG = 2**20  # frame n's first sample is n / TAG: exact in float32, and too small to make a quiet frame loud
ECHO, COMPUTE = FRAME / SR, 0.005
STALL_AT, STALL = 5.0, 1.0


async def numbered_call(handle, pcm: np.ndarray) -> tuple[dict[int, float], dict[int, float]]:
    """Send ``pcm`` in numbered frames at real time, the network holding them for the stall; when each frame
    went and when its echo came back (from the first frame)."""
    sent: dict[int, float] = {}
    back: dict[int, float] = {}
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws)
        start = trio.current_time()

        async def read() -> None:
            while True:
                message = await ws.get_message()
                if isinstance(message, bytes) and (number := round(float(np.frombuffer(message, "<f4")[0]) * TAG)):
                    back.setdefault(number, trio.current_time() - start)

        async def network() -> None:  # (the client's end of the virtual connection: what it sends is held)
            await trio.sleep_until(start + STALL_AT)
            ws._stream.stall()
            await trio.sleep(STALL)
            ws._stream.unstall()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            nursery.start_soon(network)
            for k in range(pcm.size // FRAME):
                frame = pcm[k * FRAME : (k + 1) * FRAME].astype("<f4")
                frame[0] = (k + 1) / TAG
                await trio.sleep_until(start + k * FRAME / SR)
                sent[k + 1] = trio.current_time() - start
                await ws.send_message(frame.tobytes())
            await trio.sleep(2 * STALL)
            nursery.cancel_scope.cancel()
    return sent, back


async def test_after_a_stall_the_turnaround_is_what_it_was_before(virtual_server, autojump_clock, speech_wav):
    handle = await virtual_server(first_frame_timeout=ServerSettings().first_frame_timeout, compute_seconds=COMPUTE)
    pcm, _ = sphn.read(str(speech_wav), sample_rate=SR)
    pcm = pcm[0, : 16 * SR].astype(np.float32)
    sent, back = await numbered_call(handle, pcm)
    turnaround = [(sent[n], back[n] - sent[n]) for n in sorted(back)]
    before = statistics.median(t for at, t in turnaround if at < STALL_AT)
    after = [t for at, t in turnaround if at >= STALL_AT + STALL + 4.0]
    assert before == pytest.approx(ECHO + COMPUTE, abs=0.001)
    assert statistics.median(after) == pytest.approx(before, abs=0.001), statistics.median(after)
    assert max(after) <= before + 0.040  # every frame, not only the median
    # Only silence was skipped to catch up: every speech frame came back.
    speech = {k + 1 for k in range(pcm.size // FRAME) if not is_silent(pcm[k * FRAME : (k + 1) * FRAME])}
    assert speech <= set(back)
