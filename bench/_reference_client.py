"""One Moshi-protocol conversation with timestamps, and the arithmetic on them.

``bench/reference.py`` drives both servers with :func:`converse`: the same
client code, the same pre-encoded Ogg Opus pages of real speech (from
``bench/load.py``'s :func:`~load.encode_pages`), sent one 40 ms page per
message at real-time pace from the moment the handshake arrives, as the
official web client does once its recorder starts.  Everything the client
sees is time-stamped on one clock; the analysis functions below are pure so
that ``tests/bench/test_reference.py`` can check them without a network.

Which output answers which input frame
--------------------------------------
Both servers run one model step per input frame, but they differ in what the
client can count:

* **moshi.server** steps as soon as a frame is complete, and its ``LMGen``
  returns nothing for the first step (the acoustic delay of one frame).  So
  output ``j`` comes from the step that consumed input frame ``j + 1``
  (:func:`reference_frame_map`); the run checks that it received exactly one
  output fewer than the complete frames it sent.
* **pplex-trio** steps every 80 ms whether input is there or not: ticks before
  the first frame arrives, or when a frame is late, are fed silence and still
  produce an output, and the phase-aligned framer may skip a few ms of input
  once so that later frames end at the newest audio.  The client cannot see
  that, so the benchmark reads the server's own counters (``/metrics``:
  frames consumed, silence-filled ticks, skipped samples) during a single
  conversation, at the times of :func:`scrape_times`; between two scrapes
  with no silence-filled tick and no skip, the ``j``-th output is the step
  that consumed the next frame in order (:func:`ours_frame_map`).  Outputs in
  an interval with such an event are left out, not guessed.

The *turnaround* of an output is then its arrival time minus the time the
client sent the page holding the last sample of the frame that step consumed
(on the grid of decoded samples, which both servers' sphn readers share with
the client: a frame is complete with its second 40 ms page).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence

import numpy as np
import sphn
import trio

from pplex_trio.client import open_websocket

SR, FRAME = 24_000, 1920
PAGE_S = 0.040  # one Ogg page of two 20 ms packets per message, like the browser
SCRAPE_EVERY_S = 0.5  # while the counters are likely to move: the first seconds ...
SCRAPE_FAST_FOR_S = 2.0
SCRAPE_SLOW_EVERY_S = 4.0  # ... and then: a scrape is not free for the server being measured (see scrape_times)

HANDSHAKE, AUDIO, TEXT, ERROR, PING = 0x00, 0x01, 0x02, 0x05, 0x06


@dataclasses.dataclass
class Trace:
    """What one client saw, in seconds on the run's clock."""

    index: int
    connect_at: float = math.nan
    handshake_at: float = math.nan
    pages_sent_at: list[float] = dataclasses.field(default_factory=list)  # audio pages (after the headers)
    audio_at: list[float] = dataclasses.field(default_factory=list)  # 0x01 messages received
    text: int = 0
    pings: int = 0
    closed_at: float = math.nan
    error: str = ""
    server_error: str = ""  # a 0x05 message, if any


@dataclasses.dataclass(frozen=True)
class Counters:
    """Our server's per-frame counters at one moment (differences from before the conversation)."""

    at: float
    frames_in: float  # input frames consumed by a tick
    silence: float  # live ticks fed silence (no whole frame waiting)
    skipped: float  # input samples skipped by phase alignment
    dropped: float  # frames dropped by any bounded queue

    @property
    def ticks(self) -> float:
        return self.frames_in + self.silence


def chat_url(http_url: str, **query: float | str) -> str:
    """The ``/api/chat`` WebSocket URL with the official client's query parameters."""
    base = http_url.replace("http://", "ws://", 1).rstrip("/") + "/api/chat"
    return base + ("?" + urllib.parse.urlencode(query) if query else "")


def decoded_samples(pages: Sequence[bytes]) -> list[int]:
    """Samples sphn's reader yields after each *audio* page (the first two pages are headers)."""
    reader = sphn.OpusStreamReader(SR)
    for page in pages[:2]:
        reader.append_bytes(page)
    return [int(reader.append_bytes(page).size) for page in pages[2:]]


async def converse(
    url: str,
    pages: Sequence[bytes],
    trace: Trace,
    *,
    clock: Callable[[], float],
    stream_pages: int,
    wait_timeout: float,
    drain: float,
) -> None:
    """Connect, wait for ``0x00``, stream ``stream_pages`` audio pages in real time, drain, close.

    Errors are recorded in ``trace.error``, never raised: one failed client
    must not stop the run.
    """
    try:
        trace.connect_at = clock()
        async with open_websocket(url) as ws:
            with trio.fail_after(wait_timeout):
                while True:
                    message = await ws.get_message()
                    if message[:1] == bytes([HANDSHAKE]):
                        break
                    trace.pings += message[:1] == bytes([PING])
            trace.handshake_at = clock()

            async def receive() -> None:
                while True:
                    message = await ws.get_message()
                    kind = message[0] if message else -1
                    if kind == AUDIO:
                        trace.audio_at.append(clock())
                    elif kind == TEXT:
                        trace.text += 1
                    elif kind == ERROR:
                        trace.server_error = bytes(message[1:]).decode("utf-8", "replace")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                for page in pages[:2]:
                    await ws.send_message(bytes([AUDIO]) + page)
                deadline = trio.current_time()
                for page in pages[2 : 2 + stream_pages]:
                    await ws.send_message(bytes([AUDIO]) + page)
                    trace.pages_sent_at.append(clock())
                    deadline += PAGE_S
                    await trio.sleep_until(deadline)
                await trio.sleep(drain)
                nursery.cancel_scope.cancel()
    except Exception as exc:  # noqa: BLE001 - a benchmark client reports, it does not crash the run
        trace.error = f"{type(exc).__name__}: {exc}"
    finally:
        trace.closed_at = clock()


def scrape_times(
    fast_every: float = SCRAPE_EVERY_S, fast_for: float = SCRAPE_FAST_FOR_S, slow_every: float = SCRAPE_SLOW_EVERY_S
) -> Iterator[float]:
    """Seconds from the start at which to read the counters: often at first, then seldom.

    The silence-filled ticks come at the start (before the first frame is
    in) and, after that, rarely; an interval with one loses its outputs, so
    short intervals matter only at first.  And each scrape costs the server
    a ``/metrics`` render on its event loop, which holds the GIL from the
    engine's thread for a few ms: scraped every 0.5 s throughout, our model
    step took 10.5-19 ms instead of a steady 11-12 (2026-12-01), while the
    reference, which is never scraped, paid nothing.
    """
    at = 0.0
    while at < fast_for:
        at += fast_every
        yield at
    while True:
        at += slow_every
        yield at


async def scrape_while(
    running: trio.Event,
    read: Callable[[], Awaitable[Counters]],
    into: list[Counters],
    times: Iterable[float] | None = None,
) -> None:
    """Append ``read()`` at each of ``times`` (seconds from now) and once ``running`` is set."""
    start = trio.current_time()
    for at in scrape_times() if times is None else times:
        with trio.move_on_at(start + at):
            await running.wait()
        if running.is_set():
            break
        into.append(await read())
    into.append(await read())


# --- which frame each output answers -----------------------------------------------


FrameMap = list[tuple[int, int] | None]  # per output: (input frame, samples skipped before it), or None


def reference_frame_map(outputs: int) -> FrameMap:
    """moshi.server: output ``j`` is the step that consumed input frame ``j + 1``."""
    return [(j + 1, 0) for j in range(outputs)]


def ours_frame_map(outputs: int, counters: Sequence[Counters]) -> FrameMap:
    """pplex-trio: map outputs (one per live tick, in order) to frames, from counter snapshots.

    ``counters`` must start with a snapshot taken before the conversation
    (all zero).  Ticks between consecutive snapshots that saw no silence-filled
    tick and no skip consumed one frame each, in order; every other output
    (before the first frame, around an underrun or a skip, after the input
    ended, after any drop) maps to ``None``.
    """
    mapping: FrameMap = [None] * outputs
    if any(c.dropped for c in counters):
        return mapping
    for before, after in itertools.pairwise(counters):
        if after.silence != before.silence or after.skipped != before.skipped:
            continue
        first, last = int(before.ticks), int(after.ticks)
        for j in range(first, min(last, outputs)):
            mapping[j] = (int(before.frames_in) + j - first, int(before.skipped))
    return mapping


def turnarounds(trace: Trace, mapping: FrameMap, page_samples: Sequence[int]) -> list[float]:
    """Seconds from sending the page that completed each mapped frame to receiving its output."""
    ends = np.cumsum(page_samples[: len(trace.pages_sent_at)])
    out = []
    for received, frame in zip(trace.audio_at, mapping):
        if frame is None:
            continue
        n, skipped = frame
        page = int(np.searchsorted(ends, (n + 1) * FRAME + skipped, side="left"))
        if page < len(trace.pages_sent_at):
            out.append(received - trace.pages_sent_at[page])
    return out


def complete_frames(trace: Trace, page_samples: Sequence[int]) -> int:
    return int(sum(page_samples[: len(trace.pages_sent_at)]) // FRAME)


# --- many clients ---------------------------------------------------------------------


def max_concurrent(traces: Sequence[Trace]) -> int:
    """Most clients receiving audio at the same moment (first to last audio message)."""
    events = []
    for t in traces:
        if t.audio_at:
            events.append((t.audio_at[0], 1))
            events.append((t.audio_at[-1], -1))
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    best = live = 0
    for _, step in events:
        live += step
        best = max(best, live)
    return best


def frames_within(trace: Trace, seconds: float) -> int:
    """Audio messages received in the first ``seconds`` after the client connected."""
    return bisect.bisect_right(trace.audio_at, trace.connect_at + seconds)


def quantile(values: Sequence[float], q: float) -> float:
    return float(np.quantile(values, q)) if len(values) else math.nan
