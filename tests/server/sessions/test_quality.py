"""Conversation quality end to end: the echo engine answers the caller ``DELAY`` frames later, so the figures are known.

The caller says two 10-frame tones, 40 frames apart; the echo says each again 15 frames after it began, so the
agent starts 5 frames (400 ms) after each of the caller's ends of speech: two responses of 400 ms, 2 × 5 frames of
dead air, no talk-over, no barge-in, and the agent speaks 20 frames of the conversation.
"""

from __future__ import annotations

import json
import logging
import os
import re

import numpy as np
import pytest
import trio

from _helpers.ws import FRAME, SR, raw_open, read_until_closed

DELAY = 15  # frames: the echo engine's delay
TONE = 10  # frames each tone lasts
GAP = 40  # frames of silence after each


def _caller_audio() -> np.ndarray:
    t = np.arange(TONE * FRAME) / SR
    tone = (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    silence = np.zeros(GAP * FRAME, np.float32)
    return np.concatenate([tone, silence, tone, silence])


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


async def test_quality_figures_of_an_echoed_call(virtual_server, autojump_clock, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pplex_trio")
    folder = tmp_path / "records"
    handle = await virtual_server(delay_frames=DELAY, record_dir=folder)
    audio = _caller_audio()
    async with handle.open_websocket(handle.ws_url + "/v1/audio/duplex") as ws:
        await raw_open(ws)

        async def read() -> None:
            while True:
                await ws.get_message()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for i in range(0, audio.size, FRAME):
                await ws.send_message(audio[i : i + FRAME].astype("<f4").tobytes())
                await trio.sleep(FRAME / SR)
            await trio.sleep(2.0)  # (past the hangover: every figure decided)
            (session,) = (await handle.get_json("/api/sessions"))["sessions"]
            nursery.cancel_scope.cancel()
        await ws.send_message(json.dumps({"type": "close"}))
        await read_until_closed(ws)

    quality = session["quality"]
    assert quality["response_latency_ms"] == {"last": 400, "median": 400, "count": 2}
    assert quality["talk_over_s"] == 0 and quality["barge_ins"] == 0
    assert quality["dead_air_s"] == pytest.approx(2 * 5 * 0.08)
    assert 0 < quality["agent_share"] < 0.5

    with trio.fail_after(10):
        while not any(name.endswith(".json") for name in os.listdir(folder)):
            await trio.sleep(0.05)
    (record_json,) = [name for name in os.listdir(folder) if name.endswith(".json")]
    record = json.loads((folder / record_json).read_text())
    assert record["quality"]["response_latency_ms"] == {"last": 400, "median": 400, "count": 2}
    assert record["quality"]["agent_share"] == round(2 * TONE / record["frames"], 3)

    metrics = await handle.metrics()
    assert _metric(metrics, "pplex_response_latency_seconds_count") == 2
    assert _metric(metrics, "pplex_response_latency_seconds_sum") == pytest.approx(0.8)
    assert _metric(metrics, 'pplex_response_latency_seconds_bucket{le="0.3"}') == 0
    assert _metric(metrics, 'pplex_response_latency_seconds_bucket{le="0.5"}') == 2
    assert _metric(metrics, "pplex_dead_air_seconds_count") == 1
    assert _metric(metrics, "pplex_dead_air_seconds_sum") == pytest.approx(0.8)
    assert _metric(metrics, "pplex_talk_over_seconds_sum") == 0
    assert _metric(metrics, "pplex_agent_speaking_share_sum") == pytest.approx(2 * TONE / record["frames"])
    assert _metric(metrics, "pplex_barge_ins_total") == 0

    (ended,) = [r.getMessage() for r in caplog.records if re.search(r"session \d+ \(raw\) ended", r.getMessage())]
    assert "completed (response 400 ms median of 2, talk-over 0.0 s, dead air 0.8 s" in ended
