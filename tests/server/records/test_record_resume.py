"""A call resumed after a dropped connection is one record, its outage a marked gap; a call nobody resumes is
finished when its window lapses.

The raw protocol on the virtual network and clock, with the echo engine (a frame of value ``v`` comes back a
frame later): the record's two channels are read back with the standard library's ``wave`` and ``json``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import trio

from _helpers.ws import FRAME
from tests.server.records.test_records import only_record, read_wav, until
from tests.server.sessions.test_resume import PATH, open_call, talk

CALLER, AGENT = 0, 1
OUTAGE = 5.0  # s between the reset and the resume


def _frames_of(channel: np.ndarray, value: float) -> list[int]:
    """The frames of ``channel`` (16-bit) that hold ``value`` all through."""
    frames = channel[: channel.size // FRAME * FRAME].reshape(-1, FRAME)
    return [k for k, f in enumerate(frames) if np.all(f == round(value * 32768))]


async def test_a_resumed_call_is_one_record_with_its_outage_a_silent_marked_gap(
    virtual_server, autojump_clock, tmp_path
):
    folder = tmp_path / "records"
    handle = await virtual_server(slots=1, record_dir=folder)
    bad, ready = await open_call(handle)
    await talk(bad, [0.25, 0.25, 0.25])
    bad.reset()
    await trio.sleep(OUTAGE)
    assert not any(name.endswith(".json") for name in os.listdir(folder))  # paused: the record goes on
    async with handle.open_websocket(PATH) as ws:
        await ws.send_message(json.dumps({"type": "open", "resume": ready["resume"]}))
        assert json.loads(await ws.get_message())["resumed"] is True
        await talk(_Ws(ws), [0.5, 0.5])
        await ws.send_message(json.dumps({"type": "close"}))
        with trio.fail_after(5):
            while not (isinstance(m := await ws.get_message(), str) and json.loads(m)["type"] == "done"):
                pass
    await until(lambda: any(name.endswith(".json") for name in os.listdir(folder)))
    record_id = only_record(folder)  # one call, one record
    record = json.loads((folder / f"{record_id}.json").read_text())
    assert record["ending"] == "completed" and record["complete"] is True
    (gap,) = record["gaps"]
    assert gap["reason"] == "connection lost"
    assert gap["end"] - gap["start"] == pytest.approx(OUTAGE, abs=0.2)  # the outage's length, to a frame or two

    audio, _ = read_wav(folder / f"{record_id}.wav")
    assert audio.shape[0] == record["frames"] * FRAME
    before, after = _frames_of(audio[:, CALLER], 0.25), _frames_of(audio[:, CALLER], 0.5)
    start, end = round(gap["start"] / 0.08), round(gap["end"] / 0.08)
    assert len(before) == 3 and len(after) == 2
    assert max(before) < start and min(after) >= end  # each side of the gap, on the call's real timeline
    assert not audio[start * FRAME : end * FRAME].any()  # the outage: silence on both channels
    assert _frames_of(audio[:, AGENT], 0.5) and min(_frames_of(audio[:, AGENT], 0.5)) > end  # the echo, after it

    vtt = (folder / f"{record_id}.vtt").read_text()
    assert f"{_cue_time(gap['start'])} --> {_cue_time(gap['end'])}\n[connection lost]" in vtt


async def test_a_paused_call_nobody_resumes_is_recorded_once_when_its_window_lapses(
    virtual_server, autojump_clock, tmp_path
):
    folder = tmp_path / "records"
    handle = await virtual_server(slots=1, record_dir=folder, resume_seconds=4)
    bad, _ = await open_call(handle)
    await talk(bad, [0.25, 0.25])
    bad.reset()
    await trio.sleep(3)
    assert not any(name.endswith(".json") for name in os.listdir(folder))  # in its window: still in progress
    listed = (await handle.get_json("/api/recordings"))["recordings"]
    assert [r["in_progress"] for r in listed] == [True]
    await trio.sleep(2)
    await until(lambda: any(name.endswith(".json") for name in os.listdir(folder)))
    record = json.loads((folder / f"{only_record(folder)}.json").read_text())
    assert record["ending"] == "client_closed" and record["complete"] is True and record["gaps"] == []
    assert len(_frames_of(read_wav(folder / f"{only_record(folder)}.wav")[0][:, CALLER], 0.25)) == 2


async def test_a_paused_calls_record_is_finished_when_the_server_stops(virtual_server, autojump_clock, tmp_path):
    folder = tmp_path / "records"
    handle = await virtual_server(slots=1, record_dir=folder)
    bad, _ = await open_call(handle)
    await talk(bad, [0.25])
    bad.reset()
    await trio.sleep(1)
    await handle.shutdown()
    await until(lambda: any(name.endswith(".json") for name in os.listdir(folder)))
    assert json.loads((folder / f"{only_record(folder)}.json").read_text())["complete"] is True


async def test_a_call_taken_over_by_a_new_connection_is_one_record_with_no_gap(
    virtual_server, autojump_clock, tmp_path
):
    folder = tmp_path / "records"
    handle = await virtual_server(slots=1, record_dir=folder)
    bad, ready = await open_call(handle)
    await talk(bad, [0.25])
    async with handle.open_websocket(PATH) as ws:  # while the first connection lives: it is closed, no outage
        await ws.send_message(json.dumps({"type": "open", "resume": ready["resume"]}))
        assert json.loads(await ws.get_message())["resumed"] is True
        await talk(_Ws(ws), [0.5])
        await ws.send_message(json.dumps({"type": "close"}))
        with trio.fail_after(5):
            while not (isinstance(m := await ws.get_message(), str) and json.loads(m)["type"] == "done"):
                pass
    await until(lambda: any(name.endswith(".json") for name in os.listdir(folder)))
    record = json.loads((folder / f"{only_record(folder)}.json").read_text())
    assert record["ending"] == "completed" and record["gaps"] == []


class _Ws:
    """A trio-websocket connection as ``talk`` speaks to a bad client."""

    def __init__(self, ws):
        self.send, self.receive = ws.send_message, ws.get_message


def _cue_time(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"00:{ms // 60000:02d}:{ms // 1000 % 60:02d}.{ms % 1000:03d}"
