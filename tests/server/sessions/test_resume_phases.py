"""A resumable call dropped at every phase of every protocol (issue 48): what is left of it afterwards.

The table (``CELLS``), one row per protocol and phase, and what the drop does:

* ``prompt``: the call's voice prompt and persona are running (its lease STARTING or PREFILL), before its
  handshake: the client has no token yet, so the call **ends** and its slot drains.
* ``live``: past the handshake (READY or LIVE): the call is **paused**, its slot held for the window.
* ``flushing``: the client hung up with its protocol's own end (raw ``close``, Live ``session.close``) and the
  last words are going out: the call is over, so it **ends** (nothing to resume).  Moshi's ``0x12`` and
  Realtime have no flushing phase (``0x12`` ends at once; Realtime has no hang-up).
* ``reprompt``: a Realtime ``session.update`` with a new persona runs the prompt again mid-call; the client
  holds a token, but the engine pauses only a lease that is READY or LIVE, so the call **ends** (its token is
  then refused as unknown: ``docs/PROTOCOL.md``).

Every cell: no warning and no traceback in the log; an ended call frees its slot and is not counted as a
resume outcome; a paused one holds its slot.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.parse

import numpy as np
import pytest
import trio

from _helpers.live import PATH as LIVE
from pplex_trio.engine import EchoEngine, LeaseState
from pplex_trio.protocol import raw

FRAME = 1920
PROMPT = {LeaseState.STARTING, LeaseState.PREFILL}
BEGUN = {LeaseState.READY, LeaseState.LIVE}
ENGINE = {"prefill_steps": 40, "prefill_seconds": 0.1}  # a 4 s prompt
BACKLOG = 30  # frames sent at once before the hang-up: a 2.4 s flush


def pcm16(value: int) -> str:
    return base64.b64encode(np.full(FRAME, value, "<i2").tobytes()).decode()


async def next_json(bad, kind: str) -> dict:
    """Read JSON events until one of ``kind`` (binary messages skipped)."""
    while True:
        message = await bad.receive()
        if isinstance(message, str) and (event := json.loads(message))["type"] == kind:
            return event


# -- each protocol: how a call starts (naming a voice), reaches its handshake, hangs up, re-prompts ----------


async def raw_start(handle):
    bad = await handle.bad_client("/v1/audio/duplex")
    await bad.send(json.dumps({"type": "open", "persona": "a pirate", "voice": "NATF1.pt"}))
    return bad


async def raw_live(bad):
    assert "resume" in await next_json(bad, "ready")
    await bad.send(raw.pcm_frame(np.full(FRAME, 0.1, np.float32)))


async def raw_hang_up(bad):
    for _ in range(BACKLOG):
        await bad.send(raw.pcm_frame(np.full(FRAME, 0.1, np.float32)))
    await bad.send(json.dumps({"type": "close"}))


async def moshi_start(handle):
    query = urllib.parse.urlencode({"resumable": 1, "text_prompt": "a pirate", "voice_prompt": "NATF1.pt"})
    return await handle.bad_client("/api/chat?" + query)


async def moshi_live(bad):
    assert await bad.receive() == b"\x00"
    assert (await bad.receive())[:1] == b"\x11"  # (the token)


async def realtime_start(handle):
    bad = await handle.bad_client("/v1/realtime?resumable=1")
    await next_json(bad, "session.created")
    session = {"type": "realtime", "instructions": "A pirate.", "audio": {"output": {"voice": "marin"}}}
    await bad.send(json.dumps({"type": "session.update", "session": session}))
    await bad.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm16(1000)}))
    return bad


async def realtime_live(bad):
    while "resume_token" not in (await next_json(bad, "session.updated"))["session"]:
        pass
    await next_json(bad, "response.created")


async def realtime_reprompt(bad):
    await bad.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "A nun."}}))


async def live_start(handle):
    bad = await handle.bad_client(LIVE + "?resumable=1")
    session = {"model": "gpt-live-1", "instructions": "Be kind.", "audio": {"output": {"voice": "marin"}}}
    await bad.send(json.dumps({"type": "session.start", "session": session}))
    return bad


async def live_live(bad):
    assert "resume_token" in (await next_json(bad, "session.started"))["session"]
    await bad.send(json.dumps({"type": "session.input_audio.append", "audio": pcm16(1000)}))


async def live_hang_up(bad):
    for _ in range(BACKLOG):
        await bad.send(json.dumps({"type": "session.input_audio.append", "audio": pcm16(1000)}))
    await bad.send(json.dumps({"type": "session.close"}))


PROTOCOLS = {
    "raw": (raw_start, raw_live),
    "moshi": (moshi_start, moshi_live),
    "realtime": (realtime_start, realtime_live),
    "live": (live_start, live_live),
}
# phase -> (what moves the live call there, the lease states that show it is there); None: before the handshake
PHASES = {
    "prompt": (None, PROMPT),
    "live": (None, BEGUN),
    "flushing": ({"raw": raw_hang_up, "live": live_hang_up}, {LeaseState.FLUSHING}),
    "reprompt": ({"realtime": realtime_reprompt}, PROMPT),
}
CELLS = [
    *[(protocol, "prompt", "ended") for protocol in PROTOCOLS],
    *[(protocol, "live", "paused") for protocol in PROTOCOLS],
    ("raw", "flushing", "ended"),
    ("live", "flushing", "ended"),
    ("realtime", "reprompt", "ended"),
]


async def lease_state(handle) -> LeaseState | None:
    (session,) = handle.server.sessions
    return None if session.lease is None else session.lease.state


async def reach(handle, states: set[LeaseState]) -> None:
    with trio.fail_after(10):
        while await lease_state(handle) not in states:
            await trio.sleep(0.01)


@pytest.mark.parametrize(("protocol", "phase", "outcome"), CELLS)
async def test_a_drop_at_each_phase_ends_or_pauses_the_call(
    virtual_server, autojump_clock, caplog, protocol, phase, outcome
):
    caplog.set_level(logging.INFO, logger="pplex_trio")
    handle = await virtual_server(EchoEngine(1, **ENGINE), slots=1)
    start, live = PROTOCOLS[protocol]
    move, states = PHASES[phase]
    bad = await start(handle)
    if phase != "prompt":
        await live(bad)
    if move is not None:
        await move[protocol](bad)
    await reach(handle, states)
    bad.reset()
    await trio.sleep(3)  # (an ended call's slot has drained by then)
    slots = (await handle.get_json("/health"))["slots"]
    left = (await handle.get_json("/api/sessions"))["sessions"]
    if outcome == "paused":
        assert slots["held"] == 1 and slots["free"] == 0  # (a paused call has no connection to list)
    else:
        assert slots["held"] == 0 and slots["free"] == 1
    assert left == []
    assert await handle.resumes() == {"resumed": 0, "expired": 0, "refused": 0, "wrong_token": 0}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
