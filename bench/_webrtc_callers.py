"""bench/webrtc's callers for the CPU runs, in a process of their own (their CPU is not the server's).

``python bench/_webrtc_callers.py TRANSPORT N ADDRESS SECONDS PAGE_MS``: N callers (``webrtc``: aiortc calls to
``/v1/realtime/calls``, sending what a browser sends: ``BrowserMicrophone``; ``realtime``: ``/v1/realtime``
WebSockets, ``PAGE_MS`` of audio per append) say real speech in turns at real time; prints ``live`` once every
call is, and hangs up after SECONDS (or when ended).
"""

from __future__ import annotations

import asyncio
import fractions
import pathlib
import sys

import av
import numpy as np
import opuslib_next
import soxr
import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from _load_clients import ClientStats, encode_stream, run_client  # noqa: E402
from _load_clients import speech as turns  # noqa: E402

from _helpers.webrtc import PACKET, RATE, Caller, Microphone  # noqa: E402


class BrowserMicrophone(Microphone):
    """What a browser sends: mono Opus at 48 kHz in 20 ms packets (VoIP mode, 32 kbit/s, in-band FEC, as Chrome
    encodes by default), made once beforehand and handed to aiortc ready (its own encoder, stereo at 96 kbit/s on a
    worker thread per packet, would cost the callers' process more than the server's is measured at, and
    thirty-two of them fall behind real time on two cores: the server would be measured on fewer packets)."""

    def __init__(self, packets: list[bytes]) -> None:
        super().__init__()
        self._packets = packets

    async def recv(self) -> av.Packet:  # type: ignore[override]
        await self._paced()
        packet = av.Packet(self._packets[(self._pts // PACKET) % len(self._packets)])
        packet.pts, packet.time_base = self._pts, fractions.Fraction(1, RATE)
        self._pts += PACKET
        return packet


def browser_packets(signal: np.ndarray) -> list[bytes]:
    encoder = opuslib_next.Encoder(RATE, 1, opuslib_next.APPLICATION_VOIP)
    encoder.bitrate, encoder.inband_fec, encoder.packet_loss_perc = 32_000, 1, 5
    pcm = np.round(np.clip(signal, -1, 1) * 32767).astype(np.int16)
    return [encoder.encode(pcm[i : i + PACKET].tobytes(), PACKET) for i in range(0, pcm.size - PACKET + 1, PACKET)]


async def webrtc(clients: int, address: str, seconds: float) -> None:
    said = browser_packets(soxr.resample(turns(seconds), 24_000, RATE).astype(np.float32))
    callers = [Caller(microphone=BrowserMicrophone(said)) for _ in range(clients)]
    try:
        for caller in callers:
            response = await caller.call("http://" + address)
            assert response.status_code == 201, response.text
        await asyncio.wait_for(asyncio.gather(*(c.opened.wait() for c in callers)), 60)
        print("live", flush=True)
        await asyncio.sleep(seconds)
    finally:
        await asyncio.gather(*(c.close() for c in callers), return_exceptions=True)


async def websocket(clients: int, address: str, seconds: float, page_ms: int) -> None:
    pages = encode_stream("realtime", seconds, page_ms)
    live, stop = trio.Semaphore(0), trio.Event()
    stats = [ClientStats(i) for i in range(clients)]
    async with trio.open_nursery() as nursery:
        for s in stats:
            nursery.start_soon(
                lambda s=s: run_client(
                    f"ws://{address}/v1/realtime",
                    pages,
                    page_ms,
                    s,
                    decode=False,
                    live=live,
                    stop=stop,
                    started_at=trio.current_time(),
                    random_phase=True,
                )
            )
        for _ in range(clients):
            await live.acquire()
        errors = [s.error for s in stats if s.error]
        print("live" if not errors else f"failed: {errors[0]}", flush=True)
        await trio.sleep(seconds)
        stop.set()


def main(argv: list[str]) -> int:
    transport, clients, address, seconds, page_ms = argv[0], int(argv[1]), argv[2], float(argv[3]), int(argv[4])
    if transport == "webrtc":
        asyncio.run(webrtc(clients, address, seconds))
    else:
        trio.run(websocket, clients, address, seconds, page_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
