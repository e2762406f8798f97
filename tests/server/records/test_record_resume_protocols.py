"""A resumed Moshi or Realtime call is one record too, its outage a marked silent gap (as a raw one is:
``test_record_resume.py``).

Each call says a second of tone, drops, is resumed ``OUTAGE`` later, says another second, and ends its own way
(Moshi: ``0x12``; Realtime, which has no hang-up: its last connection goes and the window lapses).  The record's
two channels are read back with the standard library's ``wave``.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.parse

import numpy as np
import pytest
import trio

from _helpers.ws import FRAME, SR, opus_messages
from pplex_trio.protocol import moshi
from tests.server.records.test_records import only_record, read_wav, until

CALLER = 0
OUTAGE = 5.0  # s between the reset and the resume
WINDOW = 8  # --resume-seconds
TONE = (0.3 * np.sin(2 * np.pi * 440 * np.arange(SR) / SR)).astype(np.float32)  # 1 s


async def drain(bad, seconds: float) -> list[bytes | str]:
    """Read what the server sends for ``seconds`` (so that it is never blocked writing)."""
    out: list[bytes | str] = []
    with trio.move_on_after(seconds):
        while True:
            out.append(await bad.receive())
    return out


# -- Moshi: the token in a 0x11, the resume on ?resume=, the hang-up 0x12 ------------------------------------


async def moshi_connect(handle, **params):
    bad = await handle.bad_client("/api/chat?" + urllib.parse.urlencode(params))
    assert await bad.receive() == b"\x00"
    token = await bad.receive()
    assert token[:1] == b"\x11"
    return bad, json.loads(token[1:])["token"]


async def moshi_say(bad) -> None:
    for pages in opus_messages(TONE):
        for page in pages:
            await bad.send(b"\x01" + page)
    await drain(bad, 1.5)


async def moshi_call(handle) -> None:
    bad, token = await moshi_connect(handle, resumable=1)
    await moshi_say(bad)
    bad.reset()
    await trio.sleep(OUTAGE)
    again, _ = await moshi_connect(handle, resume=token)
    await moshi_say(again)
    await again.send(moshi.hangup())
    assert (await again.read_until_closed())[0] == 1000
    again.close()


# -- Realtime: the token in session.updated, the resume on ?resume=, no hang-up -----------------------------


def appends() -> list[str]:
    pcm = (TONE * 32767).astype("<i2")
    return [
        json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + FRAME]).decode()})
        for i in range(0, pcm.size, FRAME)
    ]


async def realtime_call(handle) -> None:
    bad = await handle.bad_client("/v1/realtime?resumable=1")
    token = None
    for message in appends():
        await bad.send(message)
    while token is None:
        event = json.loads(await bad.receive())
        if event["type"] == "session.updated":
            token = event["session"].get("resume_token")
    await drain(bad, 1.5)
    bad.reset()
    await trio.sleep(OUTAGE)
    again = await handle.bad_client("/v1/realtime?resume=" + token)
    for message in appends():
        await again.send(message)
    await drain(again, 1.5)
    again.reset()  # (its end, as far as the server can tell: paused again, until the window lapses)
    await trio.sleep(WINDOW + 1)


@pytest.mark.parametrize(("call", "ending"), [(moshi_call, "hangup"), (realtime_call, "client_closed")])
async def test_a_resumed_call_is_one_record_with_its_outage_a_silent_marked_gap(
    virtual_server, autojump_clock, tmp_path, call, ending
):
    folder = tmp_path / "records"
    handle = await virtual_server(slots=1, record_dir=folder, resume_seconds=WINDOW)
    await call(handle)
    await until(lambda: any(name.endswith(".json") for name in os.listdir(folder)))
    record_id = only_record(folder)  # one call, one record
    record = json.loads((folder / f"{record_id}.json").read_text())
    assert record["ending"] == ending and record["complete"] is True
    (gap,) = record["gaps"]  # (a lapsed window is the call's end, not a gap)
    assert gap["reason"] == "connection lost"
    assert gap["end"] - gap["start"] == pytest.approx(OUTAGE, abs=0.2)  # the outage's length, to a frame or two
    audio, _ = read_wav(folder / f"{record_id}.wav")
    assert audio.shape[0] == record["frames"] * FRAME
    start, end = round(gap["start"] / 0.08), round(gap["end"] / 0.08)
    assert not audio[start * FRAME : end * FRAME].any()  # the outage: silence on both channels
    heard = np.abs(audio[:, CALLER].astype(np.int32)) > 3000  # the tone, on the call's real timeline
    assert heard[: start * FRAME].sum() > SR // 2 and heard[end * FRAME :].sum() > SR // 2  # each side of it
