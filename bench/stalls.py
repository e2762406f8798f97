"""bench/stalls: what a network stall costs a caller, on our server and on NVIDIA's.

Usage (from the repository root)::

    python bench/stalls.py                                   # ours
    python bench/stalls.py --personaplex /tmp/personaplex    # and NVIDIA's server on the same tiny checkpoint

A client streams the caller's side of an 18 s conversation (the spoken
stretches of ``../shared/data``'s two recordings, in turns, with the pauses a
caller listens in) at real time, in 40 ms pages, as the official client does;
the speech the network holds what it sends for 1 s or 2.5 s (Wi-Fi retries, a
handover, a retransmission), then delivers it at once: inside the caller's first
turn, and in the pause after it.  For each run:

* **speech lost**: the caller's speech frames (RMS above -42 dBFS) the model
  never heard;
* **turnaround**: from sending the page that completes an input frame to
  receiving the output of the step that consumed it, median over the 3 s
  before the stall and over the speech from 4 s after its end;
* **caught up after**: seconds from the stall's end until the last speech
  frame whose turnaround is more than 40 ms over its value before was heard.

Then the figure a new caller sees from outside (issue 48, item 6): its own
server with the echo one frame late (``--model echo``), the first 16 s of
``speech_assistant.wav`` at real time in 80 ms frames numbered in their first
sample, a 1 s stall at 5 s; per frame, from sending it to its echo coming
back, before the stall and from 4 s after it.  (Before the fix: 84 → 158 ms,
the catch-up's last tick started early and left every later frame a tick.)

Which output answers which input frame: **ours** runs the echo test engine
(`--model echo:delay=0`) on the raw endpoint: the framing, the backlog and
the catch-up are the server's, not the model's, and the echo says exactly,
bit for bit, which frame each step heard (the Moshi and Realtime endpoints
share that path; ``tests/server/sessions/test_edges_on_every_protocol.py`` checks them
by the server's own accounts).  **NVIDIA's** server cannot
echo; it runs the tiny PersonaPlex checkpoint and steps exactly once per
complete input frame, in order (its first step returns nothing), so its
output ``j`` is the step that consumed frame ``j + 1``
(``_reference_client.reference_frame_map``).

Writes ``bench/results/NAME.json`` (``--results DIR``) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import pathlib
import statistics
import sys
import urllib.parse
from functools import partial

import numpy as np
import sphn
import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from _serverproc import ServerProcess  # noqa: E402

from _helpers import ogg  # noqa: E402
from pplex_trio.client import open_websocket  # noqa: E402
from pplex_trio.codec import is_silent  # noqa: E402

logger = logging.getLogger("bench.stalls")
SR, FRAME, PAGE = 24_000, 1920, 960
DATA = REPO.parent / "shared" / "data"
# What the official client asks NVIDIA's server for (it needs every one of them), with the golden checkpoint's voice.
NVIDIA_QUERY = urllib.parse.urlencode(
    {
        "text_prompt": "You enjoy having a good conversation.",
        "voice_prompt": "TINY0.pt",
        "text_temperature": 0.7,
        "text_topk": 25,
        "audio_temperature": 0.8,
        "audio_topk": 250,
    }
)


# The caller's side of a conversation: the spoken stretches of the two recordings (80 ms frames; the rest of
# each file is silence), in turns, with the pauses in which a caller listens to the agent.
TURNS = (
    ("pause", 0.5),
    ("speech_assistant.wav", 40, 96),
    ("pause", 3.0),
    ("speech_service.wav", 65, 105),
    ("pause", 3.0),
    ("speech_assistant.wav", 272, 325),
    ("pause", 1.0),
)
STALLS_AT = {"speech": 4.0, "pause": 6.0}  # seconds into the call: inside the first turn, inside the pause after it


def speech(seconds: float) -> np.ndarray:
    parts = []
    for turn in TURNS:
        if turn[0] == "pause":
            parts.append(np.zeros(int(turn[1] * SR), np.float32))
            continue
        name, first, last = turn
        pcm, _ = sphn.read(str(DATA / name), sample_rate=SR)
        parts.append(pcm[0, first * FRAME : last * FRAME].astype(np.float32))
    return np.concatenate(parts)[: int(seconds * SR) // FRAME * FRAME]


def sent_times(start: float, pages: int, stall_at: float, stall: float, every: float = PAGE / SR) -> list[float]:
    """When each page goes out: every 40 ms (``every``), those due during the stall all at its end."""
    times = []
    for k in range(pages):
        due = start + k * every
        held = start + stall_at <= due < start + stall_at + stall
        times.append(start + stall_at + stall if held else due)
    return times


async def call(
    url: str, messages: list[bytes], stall_at: float, stall: float, *, raw: bool, every: float = PAGE / SR
) -> tuple[list[float], list[tuple[float, bytes]]]:
    """Send ``messages`` (one per 40 ms page, or per ``every``) with the stall; returns when each went and what
    came back."""
    received: list[tuple[float, bytes]] = []
    async with open_websocket(url) as ws:
        if raw:
            await ws.send_message(json.dumps({"type": "open"}))
            while json.loads(await ws.get_message())["type"] != "ready":
                pass
        else:
            while (await ws.get_message())[:1] != b"\x00":
                pass

        async def read() -> None:
            while True:
                message = await ws.get_message()
                if isinstance(message, bytes) and (raw or message[:1] == b"\x01"):
                    received.append((trio.current_time(), message if raw else message[1:]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            times = sent_times(trio.current_time(), len(messages), stall_at, stall, every)
            for at, message in zip(times, messages):
                await trio.sleep_until(at)
                await ws.send_message(message)
            await trio.sleep(1.5 + stall)  # (a server that stays late by the stall answers the rest meanwhile)
            nursery.cancel_scope.cancel()
    return times, received


def report(
    name: str,
    pcm: np.ndarray,
    times: list[float],
    answers: list[tuple[float, int]],
    stall_at: float,
    stall: float,
    during: str = "",
    page_ends: list[int] | None = None,
) -> dict:
    """The table's row from ``answers``: when each output came, and the input sample its step's frame ended at
    (``page_ends``: the input samples sent once each message is in; by default, 40 ms of PCM each)."""
    frames = len(pcm) // FRAME
    silent = [is_silent(pcm[i * FRAME : (i + 1) * FRAME]) for i in range(frames)]
    heard = np.zeros(pcm.size, bool)
    for _, end in answers:
        heard[max(0, end - FRAME) : end] = True
    lost = [i for i in range(frames) if not silent[i] and heard[i * FRAME : (i + 1) * FRAME].mean() < 0.5]
    start = times[0]
    turn = []  # (when the frame's last page was sent, from the start; its turnaround)
    ends = np.array(page_ends if page_ends is not None else [(k + 1) * PAGE for k in range(len(times))])
    for at, end in answers:
        page = int(np.searchsorted(ends, end, side="left"))
        if page < len(times) and not silent[min(frames - 1, (end - 1) // FRAME)]:
            turn.append((times[page] - start, at - times[page]))
    end_of_stall = stall_at + stall
    before = statistics.median(t for sent, t in turn if sent < stall_at)
    after = statistics.median(t for sent, t in turn if sent >= end_of_stall + 4.0)
    late = [sent + t for sent, t in turn if sent >= end_of_stall and t > before + 0.040]  # (when heard)
    return {
        "server": name,
        "stall_s": stall,
        "during": during,
        "speech_frames": frames - sum(silent),
        "speech_lost": len(lost),
        "turnaround_before_ms": round(before * 1000, 1),
        "turnaround_after_ms": round(after * 1000, 1),
        "caught_up_after_s": round(max(late) - end_of_stall, 2) if late else 0.0,
    }


def echo_raw(received: list[tuple[float, bytes]], pcm: np.ndarray) -> list[tuple[float, int]]:
    """Where in the sent stream each echoed frame ends (found by its first 16 samples, wherever frames were cut:
    the catch-up may skip part of a frame's silence); silent output frames are not placed."""
    key = 16
    starts = {pcm[i : i + key].tobytes(): int(i) for i in np.flatnonzero(pcm[:-key])}  # (windows from a sound)
    answers = []
    for at, data in received:
        frame = np.frombuffer(data, "<f4")
        sound = np.flatnonzero(frame)  # (a frame that begins in a pause is placed by its first sound)
        if frame.size != FRAME or sound.size == 0 or (first := int(sound[0])) + key > FRAME:
            continue
        if (i := starts.get(frame[first : first + key].tobytes())) is not None:
            answers.append((at, i - first + FRAME))
    return answers


def lockstep(received: list[tuple[float, bytes]], pcm: np.ndarray, frames_sent: int) -> list[tuple[float, int]]:
    """NVIDIA's server steps once per complete input frame, in order: its output frames (as decoded) are the steps
    of the last ones of the frames sent (the first steps may return nothing: as many as outputs are missing)."""
    reader = sphn.OpusStreamReader(SR)
    arrivals: list[float] = []
    samples = 0
    for at, data in received:
        samples += reader.append_bytes(data).size
        while (len(arrivals) + 1) * FRAME <= samples:
            arrivals.append(at)
    first = max(0, frames_sent - len(arrivals))
    return [(at, (first + j + 1) * FRAME) for j, at in enumerate(arrivals)]


def decoded_ends(messages: list[bytes]) -> list[int]:
    """The input samples a server can have decoded once each Moshi message is in (sphn's reader, as it has)."""
    reader, total, ends = sphn.OpusStreamReader(SR), 0, []
    for message in messages:
        total += reader.append_bytes(message[1:]).size
        ends.append(total)
    return ends


# The black-box figure (issue 48, item 6): a new caller on the raw endpoint, the echo engine (one frame
# late), 16 s of speech_assistant.wav at real time in 80 ms frames, each numbered in its first sample.
TAG = 2**20  # frame n's first sample is n / TAG: exact in float32, too small to make a quiet frame loud
BLACK_BOX = {"seconds": 16.0, "stall_at": 5.0, "stall": 1.0}


def numbered_frames(pcm: np.ndarray) -> list[bytes]:
    """One raw message per 80 ms frame, frame k + 1's number in its first sample."""
    frames = []
    for k in range(pcm.size // FRAME):
        frame = pcm[k * FRAME : (k + 1) * FRAME].astype("<f4")
        frame[0] = (k + 1) / TAG
        frames.append(frame.tobytes())
    return frames


def numbered_row(
    pcm: np.ndarray, times: list[float], received: list[tuple[float, bytes]], stall_at: float, stall: float
) -> dict:
    """Per numbered frame, from sending it to its echo coming back: the median before the stall and from 4 s
    after it, the worst from 4 s after, and the speech frames that never came back."""
    back: dict[int, float] = {}
    for at, data in received:
        if len(data) == FRAME * 4 and (number := round(float(np.frombuffer(data[:4], "<f4")[0]) * TAG)):
            back.setdefault(number, at)
    start = times[0]
    turn = [(times[n - 1] - start, back[n] - times[n - 1]) for n in sorted(back) if n <= len(times)]
    after = [t for sent, t in turn if sent >= stall_at + stall + 4.0]
    speech = [k + 1 for k in range(len(times)) if not is_silent(pcm[k * FRAME : (k + 1) * FRAME])]
    return {
        "server": "ours, raw (echo, 1 frame late)",
        "stall_s": stall,
        "during": "speech",
        "speech_frames": len(speech),
        "speech_lost": sum(n not in back for n in speech),
        "turnaround_before_ms": round(statistics.median(t for sent, t in turn if sent < stall_at) * 1000, 1),
        "turnaround_after_ms": round(statistics.median(after) * 1000, 1),
        "turnaround_after_max_ms": round(max(after) * 1000, 1),
    }


def black_box() -> dict:
    """The issue's figure: its own server (``--model echo``), its own call."""
    pcm, _ = sphn.read(str(DATA / "speech_assistant.wav"), sample_rate=SR)
    pcm = pcm[0, : int(BLACK_BOX["seconds"] * SR)].astype(np.float32)
    stall_at, stall = BLACK_BOX["stall_at"], BLACK_BOX["stall"]
    server = ServerProcess(["-m", "pplex_trio", "serve", "--model", "echo", "--port", "0"], cwd=str(REPO))
    try:
        url = "ws://" + server.address + "/v1/audio/duplex"
        times, received = trio.run(
            partial(call, raw=True, every=FRAME / SR), url, numbered_frames(pcm), stall_at, stall
        )
    finally:
        server.stop()
    return numbered_row(pcm, times, received, stall_at, stall)


def pages_for(pcm: np.ndarray, *, raw: bool) -> list[bytes]:
    if raw:
        return [pcm[i : i + PAGE].astype("<f4").tobytes() for i in range(0, pcm.size, PAGE)]
    writer = sphn.OpusStreamWriter(SR)
    pages: list[bytes] = []
    for i in range(0, pcm.size, FRAME):
        pages.extend(ogg.split_pages(writer.append_pcm(pcm[i : i + FRAME])))
    return [b"\x01" + page for page in pages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=18.0, help="the call's length (default 18: all its turns)")
    parser.add_argument("--stalls", default="1.0,2.5", help="stall lengths in seconds (default 1.0,2.5)")
    parser.add_argument("--personaplex", type=pathlib.Path, help="a checkout of NVIDIA/personaplex: its server too")
    parser.add_argument("--black-box-only", action="store_true", help="only the figure from outside (issue 48)")
    parser.add_argument("--name", default="stalls")
    parser.add_argument("--results", type=pathlib.Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pcm = speech(args.seconds)
    runs = [(during, at, float(s)) for s in args.stalls.split(",") for during, at in STALLS_AT.items()]
    if args.black_box_only:
        runs, args.personaplex = [], None
    rows = []
    ours = ServerProcess(["-m", "pplex_trio", "serve", "--model", "echo:delay=0", "--port", "0"], cwd=str(REPO))
    try:
        url = "ws://" + ours.address
        for during, stall_at, stall in runs:
            times, received = trio.run(
                partial(call, raw=True), url + "/v1/audio/duplex", pages_for(pcm, raw=True), stall_at, stall
            )
            rows.append(report("ours, raw (echo)", pcm, times, echo_raw(received, pcm), stall_at, stall, during))
    finally:
        ours.stop()
    if args.personaplex is not None:
        from ready import GOLDEN, PERSONAPLEX_VENV, ensure_personaplex_venv, start_personaplex

        ensure_personaplex_venv(args.personaplex)
        nvidia = start_personaplex(args.personaplex, GOLDEN, PERSONAPLEX_VENV)
        try:
            url = "ws://" + nvidia.address
            for during, stall_at, stall in runs:
                times, received = trio.run(
                    partial(call, raw=False),
                    url + "/api/chat?" + NVIDIA_QUERY,
                    pages_for(pcm, raw=False),
                    stall_at,
                    stall,
                )
                messages = pages_for(pcm, raw=False)
                ends = decoded_ends(messages)
                rows.append(
                    report(
                        "NVIDIA's, Moshi (tiny)",
                        pcm,
                        times,
                        lockstep(received, pcm, ends[-1] // FRAME),
                        stall_at,
                        stall,
                        during,
                        page_ends=ends,
                    )
                )
        finally:
            nvidia.stop()
    print(f"{'server':24} {'stall':>15} {'speech lost':>12} {'turnaround before → after':>27} {'caught up after':>16}")
    for row in rows:
        print(
            f"{row['server']:24} {row['stall_s']:>4.1f}s in {row['during']:7} "
            f"{row['speech_lost']:>4} of {row['speech_frames']:<4} "
            f"{row['turnaround_before_ms']:>12.1f} → {row['turnaround_after_ms']:<8.1f} ms "
            f"{row['caught_up_after_s']:>10.2f} s"
        )
    box = black_box()
    print(
        f"\nfrom outside (issue 48): raw, echo 1 frame late, {BLACK_BOX['seconds']:.0f} s of speech in numbered 80 ms "
        f"frames, {BLACK_BOX['stall']:.1f} s stall at {BLACK_BOX['stall_at']:.0f} s: turnaround "
        f"{box['turnaround_before_ms']:.1f} → {box['turnaround_after_ms']:.1f} ms (p50; worst "
        f"{box['turnaround_after_max_ms']:.1f}) from 4 s after, "
        f"speech lost {box['speech_lost']} of {box['speech_frames']}"
    )
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{args.name}.json").write_text(json.dumps({"rows": rows, "black_box": box}, indent=1))
    return 0 if all(not math.isnan(r["turnaround_after_ms"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
