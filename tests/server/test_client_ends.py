"""``pplex-trio client`` when the call goes wrong: whatever happens to the connection, it writes what it had
received, ends with one line saying what happened, and exits 1 (virtual network and clock).

A scripted server on the virtual network speaks just enough of each protocol to send ``FRAMES`` frames of audio,
each with a text piece, 80 ms apart, then ends the connection as the test says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
import sphn
import trio
import trio_websocket

from _helpers.virtual_net import VirtualNetwork, VirtualStream
from pplex_trio._cli import build_parser, client_main
from pplex_trio.codec import pcm16_encode

SR = 24_000
FRAME = 1920
FRAMES = 12
PORT = 9100
PIECES = [f" w{i}" for i in range(FRAMES)]


def _frames() -> list[np.ndarray]:
    t = np.arange(FRAMES * FRAME) / SR
    tone = (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)
    return list(tone.reshape(FRAMES, FRAME))


async def _moshi(ws: trio_websocket.WebSocketConnection) -> None:
    await ws.send_message(b"\x00")
    writer = sphn.OpusStreamWriter(SR)
    for frame, piece in zip(_frames(), PIECES, strict=True):
        await ws.send_message(b"\x01" + writer.append_pcm(frame))
        await ws.send_message(b"\x02" + piece.encode())
        await trio.sleep(0.08)


async def _raw(ws: trio_websocket.WebSocketConnection) -> None:
    await ws.send_message(json.dumps({"type": "ready"}))
    for frame, piece in zip(_frames(), PIECES, strict=True):
        await ws.send_message(frame.astype("<f4").tobytes())
        await ws.send_message(json.dumps({"type": "text", "text": piece, "speaker": "agent"}))
        await trio.sleep(0.08)


async def _realtime(ws: trio_websocket.WebSocketConnection) -> None:
    import base64

    for kind in ("session.created", "session.updated", "response.created"):
        await ws.send_message(json.dumps({"type": kind}))
    for frame, piece in zip(_frames(), PIECES, strict=True):
        delta = base64.b64encode(pcm16_encode(frame)).decode()
        await ws.send_message(json.dumps({"type": "response.output_audio.delta", "delta": delta}))
        await ws.send_message(json.dumps({"type": "response.output_audio_transcript.delta", "delta": piece}))
        await trio.sleep(0.08)


SPEAK = {"moshi": _moshi, "raw": _raw, "realtime": _realtime}
PATHS = {"moshi": "/api/chat", "raw": "/v1/audio/duplex", "realtime": "/v1/realtime"}


def _expected_samples(protocol: str) -> int:
    """What the client gets of the ``FRAMES`` frames (Moshi's Opus decoder gives what the pages it has hold)."""
    if protocol != "moshi":
        return FRAMES * FRAME
    writer, reader = sphn.OpusStreamWriter(SR), sphn.OpusStreamReader(SR)
    return sum(reader.append_bytes(writer.append_pcm(frame)).size for frame in _frames())


Ending = Callable[[trio_websocket.WebSocketConnection, VirtualStream], Awaitable[None]]


async def _serve(
    nursery: trio.Nursery, network: VirtualNetwork, protocol: str, ending: Ending, *, refuse: int | None = None
) -> None:
    """Accept conversations on ``PORT``: speak ``protocol`` (reading what comes, as a server does), then ``ending``."""
    listener = network.listen("127.0.0.1", PORT)

    async def one(stream: VirtualStream) -> None:
        async with trio.open_nursery() as inner:
            request = await trio_websocket.wrap_server_stream(inner, stream)
            if refuse is not None:
                await request.reject(refuse, body=b'{"error": "unauthorized: a token is required"}')
                return
            ws = await request.accept()

            async def drain() -> None:
                with contextlib.suppress(trio_websocket.ConnectionClosed):  # (once it has ended the call)
                    while True:
                        await ws.get_message()

            inner.start_soon(drain)
            await SPEAK[protocol](ws)
            await ending(ws, stream)

    async def accept() -> None:
        while True:
            nursery.start_soon(one, await listener.accept())

    nursery.start_soon(accept)


async def _reset(ws: Any, stream: VirtualStream) -> None:
    stream.reset()


async def _fin(ws: Any, stream: VirtualStream) -> None:
    await stream.send_eof()  # the TCP connection closes without a WebSocket close frame


async def _error_close(ws: Any, stream: VirtualStream) -> None:
    await ws.aclose(1011, "the engine failed")


async def _going_away(ws: Any, stream: VirtualStream) -> None:
    await ws.aclose(1001, "the server is shutting down")


async def _silence(ws: Any, stream: VirtualStream) -> None:
    await trio.sleep_forever()


def _the_one_error_line(caplog) -> str:
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].exc_info is None and "Traceback" not in caplog.text
    return errors[0].getMessage()


def _assert_kept(tmp_path, protocol: str) -> None:
    pcm, rate = sphn.read(str(tmp_path / "answer.wav"))
    assert rate == SR and pcm.shape[-1] == _expected_samples(protocol)  # those frames, not padded
    pieces = json.loads((tmp_path / "answer.json").read_text())
    assert [p["text"] for p in pieces] == PIECES


ENDINGS = [
    (_reset, r"the connection was lost 1\.0 s into the call \(reset by the peer\)"),
    (_fin, r"the connection was lost 1\.0 s into the call \(the server closed the TCP connection without"),
    (_error_close, r"the server closed the connection 1\.0 s into the call \(1011 internal error: the engine"),
    (_going_away, r"the server went away 1\.0 s into the call \(1001 going away: the server is shutting down\)"),
    (_silence, r"the server sent nothing for 5 s 5\.9 s into the call"),
]


@pytest.mark.parametrize("protocol", ["moshi", "raw", "realtime"])
@pytest.mark.parametrize(("ending", "said"), ENDINGS, ids=[e.__name__.strip("_") for e, _ in ENDINGS])
async def test_a_call_cut_short_keeps_what_came_and_says_what_happened_in_one_line(
    nursery, autojump_clock, monkeypatch, tmp_path, caplog, protocol, ending, said
):
    status = await _run(nursery, monkeypatch, tmp_path, caplog, protocol, ending, timeout=5)
    assert status == 1
    line = _the_one_error_line(caplog)
    assert re.search(said, line), line
    assert re.search(rf": wrote \S*answer\.wav \(1\.0 s\) and {FRAMES} text pieces to \S*answer\.json$", line), line
    _assert_kept(tmp_path, protocol)


async def _run(
    nursery, monkeypatch, tmp_path, caplog, protocol: str, ending: Ending, timeout: float = 30, **serve: Any
) -> int:
    network = VirtualNetwork()
    await _serve(nursery, network, protocol, ending, **serve)

    async def open_tcp_stream(host: str, port: int, **_options: Any) -> VirtualStream:
        return await network.connect(host, port)

    monkeypatch.setattr(trio, "open_tcp_stream", open_tcp_stream)
    sphn.write_wav(str(tmp_path / "in.wav"), np.full(10 * SR, 0.1, np.float32), SR)  # 10 s: longer than sent
    args = build_parser().parse_args(
        ["client", f"http://127.0.0.1:{PORT}", "--input", str(tmp_path / "in.wav"), "--output"]
        + [str(tmp_path / "answer.wav"), "--text", str(tmp_path / "answer.json"), "--protocol", protocol]
        + ["--timeout", str(timeout)]
    )
    caplog.set_level(logging.INFO)
    return await client_main(args)


async def test_a_refused_handshake_is_one_line_and_writes_nothing(
    nursery, autojump_clock, monkeypatch, tmp_path, caplog
):
    status = await _run(nursery, monkeypatch, tmp_path, caplog, "moshi", _reset, refuse=401)
    assert status == 1
    line = _the_one_error_line(caplog)
    assert line == "the server refused the connection (401): unauthorized: a token is required"
    assert not (tmp_path / "answer.wav").exists() and not (tmp_path / "answer.json").exists()


async def test_nothing_listening_is_one_line(autojump_clock, monkeypatch, tmp_path, caplog):
    async def open_tcp_stream(host: str, port: int, **_options: Any) -> VirtualStream:
        return await VirtualNetwork().connect(host, port)

    monkeypatch.setattr(trio, "open_tcp_stream", open_tcp_stream)
    sphn.write_wav(str(tmp_path / "in.wav"), np.zeros(SR, np.float32), SR)
    args = build_parser().parse_args(
        ["client", "http://127.0.0.1:9", "--input", str(tmp_path / "in.wav"), "--output", str(tmp_path / "a.wav")]
    )
    assert await client_main(args) == 1
    assert _the_one_error_line(caplog).startswith("could not connect to the server (")


@pytest.mark.parametrize("protocol", ["moshi", "raw", "realtime"])
async def test_a_relay_that_resets_both_sides_8_s_into_a_call_to_the_real_server(
    virtual_server, autojump_clock, nursery, monkeypatch, tmp_path, caplog, protocol
):
    """The issue's case: the echo engine answers a 20 s clip; 8 s after the connection opened it is reset.  With
    ``--reconnect-seconds 0`` the call ends there
    (``test_client_resumes.py``: what reconnecting does)."""
    handle = await virtual_server()

    async def open_tcp_stream(host: str, port: int, **_options: Any) -> VirtualStream:
        stream = await handle.open_tcp_stream(host, port)

        async def relay_fails() -> None:
            await trio.sleep(8)
            stream.break_connection()

        nursery.start_soon(relay_fails)
        return stream

    monkeypatch.setattr(trio, "open_tcp_stream", open_tcp_stream)
    sphn.write_wav(str(tmp_path / "in.wav"), np.full(20 * SR, 0.1, np.float32), SR)
    args = build_parser().parse_args(
        [
            "client",
            handle.http_url,
            "--input",
            str(tmp_path / "in.wav"),
            "--output",
            str(tmp_path / "answer.wav"),
            "--text",
            str(tmp_path / "answer.json"),
            "--protocol",
            protocol,
        ]
        + ["--reconnect-seconds", "0"]
    )
    caplog.set_level(logging.INFO)
    assert await client_main(args) == 1
    line = _the_one_error_line(caplog)
    assert re.match(r"the connection was lost [78]\.\d s into the call \(reset by the peer\): wrote ", line), line
    pcm, _ = sphn.read(str(tmp_path / "answer.wav"))
    seconds = pcm.shape[-1] / SR
    assert 7.5 < seconds <= 8.5 and f"answer.wav ({seconds:.1f} s)" in line
    pieces = json.loads((tmp_path / "answer.json").read_text())
    assert pieces and pieces[-1]["time"] <= seconds and f"and {len(pieces)} text piece" in line
