"""``pplex-trio client`` reconnects a dropped call and resumes it (``--reconnect-seconds``), on the real server with
the echo engine, on the virtual network and clock.

A relay resets the first connection 8 s into a 20 s clip (the issue's case:
``test_client_ends.py`` has it with reconnecting off); it may also refuse
every new connection for a while, as a network that is down.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import numpy as np
import pytest
import sphn
import trio

from _helpers.virtual_net import VirtualStream
from pplex_trio._cli import build_parser, client_main

SR = 24_000
CLIP = 20


class Relay:
    """``trio.open_tcp_stream`` through a relay that breaks the first connection ``after`` seconds in, then
    refuses new ones for ``down`` seconds."""

    def __init__(self, handle, nursery, *, after: float = 8.0, down: float = 0.0):
        self.handle, self.nursery, self.after, self.down = handle, nursery, after, down
        self.connections = 0
        self.refused = 0
        self._up_at = 0.0

    async def open_tcp_stream(self, host: str, port: int, **_options: Any) -> VirtualStream:
        if trio.current_time() < self._up_at:
            self.refused += 1
            raise ConnectionRefusedError(111, "Connection refused")
        self.connections += 1
        stream = await self.handle.open_tcp_stream(host, port)
        if self.connections == 1:
            self.nursery.start_soon(self._break, stream)
        return stream

    async def _break(self, stream: VirtualStream) -> None:
        await trio.sleep(self.after)
        self._up_at = trio.current_time() + self.down
        stream.break_connection()


async def run(handle, tmp_path, protocol: str, *options: str) -> int:
    """The client on a 20 s clip of a tone (the echo engine answers it back)."""
    t = np.arange(CLIP * SR) / SR
    sphn.write_wav(str(tmp_path / "in.wav"), (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), SR)
    args = build_parser().parse_args(
        ["client", handle.http_url, "--input", str(tmp_path / "in.wav"), "--output"]
        + [str(tmp_path / "answer.wav"), "--text", str(tmp_path / "answer.json"), "--protocol", protocol]
        + list(options)
    )
    return await client_main(args)


async def session_ids(handle, seen: set) -> None:
    """Every conversation id ``/api/sessions`` shows while the call runs."""
    while True:
        seen.update(s["id"] for s in (await handle.get_json("/api/sessions"))["sessions"])
        await trio.sleep(0.5)


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("pplex_trio.client")]


@pytest.mark.parametrize("protocol", ["raw", "moshi", "realtime"])
async def test_a_call_reset_8_s_in_is_resumed_and_the_answer_keeps_real_time(
    virtual_server, autojump_clock, nursery, monkeypatch, tmp_path, caplog, protocol
):
    handle = await virtual_server(slots=1)
    relay = Relay(handle, nursery, down=1.0)  # (down: the first two reconnects are refused)
    monkeypatch.setattr(trio, "open_tcp_stream", relay.open_tcp_stream)
    seen: set = set()
    nursery.start_soon(session_ids, handle, seen)
    caplog.set_level(logging.INFO)
    assert await run(handle, tmp_path, protocol) == 0
    said = lines(caplog)
    attempts = [line for line in said if "reconnecting" in line]
    assert re.fullmatch(
        r"the connection was lost [78]\.\d s into the call \(reset by the peer\); reconnecting… \(attempt 1\)",
        attempts[0],
    )
    assert attempts[1:] == ["reconnecting… (attempt 2)", "reconnecting… (attempt 3)"]
    assert relay.refused == 2 and relay.connections == 2  # backoff 0.25, 0.5, then 1 s: the network is up again
    resumed = next(line for line in said if line.startswith("resumed the call"))
    assert re.match(r"resumed the call after 1\.[78] s \(attempt 3\); 1\.[6-9] s of the answer is silence", resumed)
    assert len(seen) == 1  # one conversation, resumed (the same id)
    assert 'pplex_resumes_total{outcome="resumed"} 1.0' in await handle.metrics()
    pcm, _ = sphn.read(str(tmp_path / "answer.wav"))
    assert pcm.shape[-1] == CLIP * SR
    # The echo comes back on both sides of the outage, and the outage is silence, at its real time.
    seconds = np.abs(pcm[0]).reshape(CLIP * 10, SR // 10).max(axis=1)
    assert (seconds[10:75] > 0.1).all() and (seconds[100:190] > 0.1).all()
    assert (seconds[82:96] == 0).all()
    final = said[-1]
    assert re.search(r"answer\.wav \(20\.0 s, 1\.[6-9] s of it silence where the connection was lost\) and \d+", final)
    pieces = json.loads((tmp_path / "answer.json").read_text())
    assert pieces[-1]["time"] > 15
    await trio.sleep(1)
    # Each hangs up at its end (raw's close, Moshi's 0x12, Realtime's session.close): no slot held for a resume.
    assert (await handle.get_json("/health"))["slots"]["held"] == 0


async def test_a_refused_resume_ends_the_call_in_one_line_keeping_what_came(
    virtual_server, autojump_clock, nursery, monkeypatch, tmp_path, caplog
):
    """The server's window (1 s here) lapses before the network is back: the resume gets 1008."""
    handle = await virtual_server(slots=1, resume_seconds=1)
    relay = Relay(handle, nursery, down=2.0)
    monkeypatch.setattr(trio, "open_tcp_stream", relay.open_tcp_stream)
    caplog.set_level(logging.INFO)
    assert await run(handle, tmp_path, "raw") == 1
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "Traceback" not in caplog.text
    assert re.match(
        r"the server ended the call [\d.]+ s into the call \(this resume token is unknown, used or expired: start a "
        r"new call\): wrote \S*answer\.wav \(8\.\d s\) and \d+ text pieces",
        errors[0].getMessage(),
    ), errors[0].getMessage()


async def test_a_network_down_longer_than_reconnect_seconds_gives_up_in_one_line(
    virtual_server, autojump_clock, nursery, monkeypatch, tmp_path, caplog
):
    handle = await virtual_server(slots=1)
    relay = Relay(handle, nursery, down=60.0)
    monkeypatch.setattr(trio, "open_tcp_stream", relay.open_tcp_stream)
    caplog.set_level(logging.INFO)
    started = trio.current_time()
    assert await run(handle, tmp_path, "moshi", "--reconnect-seconds", "5") == 1
    assert 12.5 < trio.current_time() - started < 13.5  # (8 s in, then 5 s of reconnecting)
    assert relay.refused == 5  # after 0.25, 0.75, 1.75, 3.75 and 5 s
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1
    assert re.match(
        r"the connection was lost [78]\.\d s into the call \(reset by the peer; not resumed within 5 s\)"
        r": wrote \S*answer\.wav \([78]\.\d s\)",
        errors[0],
    ), errors[0]


async def test_reconnect_seconds_0_keeps_a_drop_ending_the_call(
    virtual_server, autojump_clock, nursery, monkeypatch, tmp_path, caplog
):
    handle = await virtual_server(slots=1)
    relay = Relay(handle, nursery)
    monkeypatch.setattr(trio, "open_tcp_stream", relay.open_tcp_stream)
    assert await run(handle, tmp_path, "moshi", "--reconnect-seconds", "0") == 1
    assert relay.connections == 1
    await trio.sleep(1)
    assert (await handle.get_json("/health"))["slots"]["free"] == 1  # (not resumable: the server ended it)
