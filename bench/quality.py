#!/usr/bin/env python3
"""bench/quality: what the conversation-quality meter costs per 80 ms frame, beside the Realtime VAD.

Usage (from the repository root)::

    python bench/quality.py [--seconds 60] [--repeat 5]

It feeds real speech as the caller and the same speech 2 s later as the agent
(so both sides talk, pause and overlap) through
:class:`~pplex_trio.codec.ConversationQuality`, frame by frame, and prints the
best run's µs per frame; then the same frames through two
:class:`~pplex_trio.codec.EnergyVAD` (20 ms windows), one per channel, for
comparison.  The meter runs on the engine actor's task, once per frame and
conversation.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import wave

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pplex_trio.codec import ConversationQuality, EnergyVAD  # noqa: E402

SR, FRAME = 24_000, 1920


def speech(seconds: float) -> np.ndarray:
    with wave.open(str(REPO.parent / "shared" / "data" / "speech_assistant.wav")) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    pcm = np.tile(pcm, int(np.ceil(seconds * SR / pcm.size)))
    return pcm[: int(seconds * SR) // FRAME * FRAME]


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    caller = speech(args.seconds)
    agent = np.concatenate([np.zeros(2 * SR, np.float32), caller])[: caller.size]
    pairs = [(caller[i : i + FRAME], agent[i : i + FRAME]) for i in range(0, caller.size, FRAME)]

    def meter() -> None:
        quality = ConversationQuality()
        for heard, said in pairs:
            quality.feed(heard, said)
        quality.finish()

    def vads() -> None:
        left, right = EnergyVAD(SR), EnergyVAD(SR)
        for heard, said in pairs:
            left.feed(heard)
            right.feed(said)

    for name, fn in (("ConversationQuality.feed", meter), ("EnergyVAD.feed x 2 channels", vads)):
        print(f"{name:30s} {best(fn, args.repeat) / len(pairs) * 1e6:6.1f} µs per frame ({len(pairs)} frames)")


if __name__ == "__main__":
    main()
