"""Resume on the Moshi protocol (``/api/chat``): opt-in with ``?resumable=1``, the token in a ``0x11`` right after
the handshake, ``?resume=TOKEN`` to take a paused call up again, ``0x12`` to hang up for good.

The real server on the virtual network and clock, with the echo engine: its
text pieces count the frames its row has made (`` 0``, `` 1`` …), so the
pieces after a resume show the same row went on where it paused.
"""

import json
import urllib.parse

import pytest
import trio

from _helpers.bad_client import BadClient
from pplex_trio.engine import EchoEngine
from pplex_trio.engine._echo import scripted_transcript
from pplex_trio.protocol import moshi

WRONG = "this resume token is unknown, used or expired: start a new call"


def chat(**params) -> str:
    return "/api/chat?" + urllib.parse.urlencode(params)


async def connect(handle, **params) -> tuple[BadClient, dict | None]:
    """A Moshi call on a connection the test may reset: (the client, the JSON of its 0x11 if one came)."""
    bad = await handle.bad_client(chat(**params))
    assert await bad.receive() == b"\x00"
    if params.get("resumable") != 1 and "resume" not in params:
        return bad, None
    message = await bad.receive()
    assert message[0] == 0x11, message[:40]
    return bad, json.loads(message[1:].decode("utf-8"))


async def pieces(bad: BadClient, count: int) -> list[int]:
    """The frame numbers of the next ``count`` text pieces (the echo engine's row counter)."""
    out: list[int] = []
    while len(out) < count:
        message = await bad.receive()
        assert message[0] in (0x01, 0x02), message[:40]  # (only the official kinds while live)
        if message[0] == 0x02:
            out.append(int(message[1:].decode()))
    return out


async def refused(handle, **params) -> tuple[int | None, list[str]]:
    """A connection the server refuses: its close code and the 0x05 errors before it."""
    bad = await handle.bad_client(chat(**params))
    code, messages = await bad.read_until_closed()
    return code, [m[1:].decode() for m in messages if isinstance(m, bytes) and m[:1] == b"\x05"]


async def slots(handle) -> dict:
    return (await handle.get_json("/health"))["slots"]


async def test_the_official_client_gets_no_token_and_its_disconnect_ends_the_call(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    bad, _ = await connect(handle, text_prompt="a pirate")
    assert await pieces(bad, 5) == [0, 1, 2, 3, 4]  # handshake, then only 0x01 and 0x02 (never a 0x11)
    bad.reset()
    await trio.sleep(1)
    assert (await slots(handle))["free"] == 1  # not paused: the call ended as before
    assert (await handle.resumes()).get("resumed", 0) == 0


async def test_a_resumable_call_resumes_within_the_window_as_the_same_session_and_persona(
    virtual_server, autojump_clock
):
    handle = await virtual_server(slots=1)
    bad, first = await connect(handle, resumable=1, text_prompt="a pirate", voice_prompt="NATM1.pt")
    assert set(first) == {"token"} and len(first["token"]) >= 22  # at least 128 random bits, url-safe
    before = await pieces(bad, 3)
    (session,) = (await handle.get_json("/api/sessions"))["sessions"]
    bad.reset()
    await trio.sleep(5)  # well within the window (20 s)
    assert (await slots(handle))["held"] == 1 and (await slots(handle))["free"] == 0
    again, second = await connect(handle, resume=first["token"], text_prompt="a nun")
    assert second["resumed"] is True and second["token"] != first["token"] and "ignored" in second["notice"]
    after = await pieces(again, 3)
    assert before[-1] < after[0] < before[-1] + 8  # the same row, not stepped while paused (12 frames a second)
    (resumed,) = handle.server.sessions
    assert resumed.id == session["id"] and resumed.lease.conversation.persona == "a pirate"
    assert resumed.lease.conversation.voice == "NATM1.pt"
    assert (await handle.resumes()) == {"resumed": 1, "expired": 0, "refused": 0, "wrong_token": 0}
    quiet, third = await connect(handle, resume=second["token"])  # (taken over: no settings, no notice)
    assert set(third) == {"token", "resumed"}


async def test_a_wrong_used_or_expired_token_is_0x05_then_1008(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1, resume_seconds=4)
    assert await refused(handle, resume="not-a-token") == (1008, [WRONG])
    bad, first = await connect(handle, resumable=1)
    bad.reset()
    again, second = await connect(handle, resume=first["token"])
    assert await refused(handle, resume=first["token"]) == (1008, [WRONG])  # spent by its resume
    again.reset()
    await trio.sleep(4.5)  # the window lapses: the slot is free, the token expired
    assert (await slots(handle))["free"] == 1
    assert await refused(handle, resume=second["token"]) == (1008, [WRONG])
    assert (await handle.resumes()) == {"resumed": 1, "expired": 1, "refused": 0, "wrong_token": 3}


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"resume": ""}, "resume must be the token a 0x11 message gave"),
        ({"resume": "x", "resumable": 0}, "a resumed call stays resumable: leave out resumable=0"),
        ({"resumable": "yes"}, "resumable must be 0 or 1, got 'yes'"),
    ],
)
async def test_a_resume_that_is_no_resume_is_refused_with_1008(virtual_server, autojump_clock, params, said):
    handle = await virtual_server(slots=1)
    assert await refused(handle, **params) == (1008, [said])


@pytest.mark.parametrize("resumable", [1, 0])
async def test_0x12_hangs_up_at_once_and_pauses_nothing(virtual_server, autojump_clock, resumable):
    handle = await virtual_server(slots=1)
    bad, first = await connect(handle, resumable=resumable)
    await pieces(bad, 2)
    await bad.send(moshi.hangup())
    code, _ = await bad.read_until_closed()
    assert code == 1000
    bad.close()
    await trio.sleep(0.5)  # (the slot drains between engine calls)
    after = await slots(handle)
    assert after["free"] == 1 and after["held"] == 0
    assert 'pplex_sessions_ended_total{outcome="hangup",protocol="moshi"} 1.0' in await handle.metrics()
    if first is not None:
        assert await refused(handle, resume=first["token"]) == (1008, [WRONG])


async def test_a_drop_while_queued_or_preparing_ends_the_call_and_a_live_one_pauses(virtual_server, autojump_clock):
    """Every phase of a Moshi call: queued, preparing (its voice prompt and persona run as prefill), live.  Only a
    call past its handshake is paused (its lease READY or LIVE, the engine's ``PAUSABLE_STATES``): before it the
    client has no token.  Moshi has no flushing phase, unlike raw's ``close``: its client just goes, or hangs up
    with 0x12, which ends the call at once with nothing flushed."""
    engine = EchoEngine(1, prefill_steps=40, prefill_seconds=0.1, delay_frames=1)  # a 4 s prompt
    handle = await virtual_server(engine, slots=1)
    holder = await handle.bad_client(chat(resumable=1))
    queued = await handle.bad_client(chat(resumable=1, text_prompt="waits", voice_prompt="NATF1.pt"))
    await wait_for_states(handle, ["preparing", "queued"])
    queued.reset()  # queued: gone, nothing kept
    await wait_for_states(handle, ["preparing"])
    holder.reset()  # preparing (the prompt is running): gone, its slot drains
    await trio.sleep(5)
    after = await slots(handle)
    assert after["free"] == 1 and after["held"] == 0
    assert (await handle.get_json("/api/sessions"))["sessions"] == []
    live, token = await connect(handle, resumable=1)
    live.reset()  # live: paused, its slot held for the resume
    await trio.sleep(1)
    assert (await slots(handle))["held"] == 1
    assert (await handle.resumes()).get("expired", 0) == 0


async def wait_for_states(handle, states: list[str]) -> None:
    with trio.fail_after(10):
        while sorted(s["state"] for s in (await handle.get_json("/api/sessions"))["sessions"]) != sorted(states):
            await trio.sleep(0.05)


async def test_a_resume_that_asks_again_gets_the_callers_words(virtual_server, autojump_clock):
    """A resume keeps the call's settings, but what the connection is sent is its own: ``transcribe_caller=1``
    again on the resume's query, or no 0x10."""
    script = scripted_transcript({30: " hel", 31: "lo", 70: " wor", 71: "ld"}, set())
    handle = await virtual_server(EchoEngine(1, prefill_steps=2, transcript=script, transcript_delay=0.4), slots=1)
    bad, first = await connect(handle, resumable=1, transcribe_caller=1)
    assert await pieces(bad, 2) == [0, 1]
    bad.reset()
    quiet, second = await connect(handle, resume=first["token"])
    assert (await pieces(quiet, 50))[-1] > 45  # (only 0x01 and 0x02: " hel", "lo" were not sent)
    quiet.reset()
    again, _ = await connect(handle, resume=second["token"], transcribe_caller=1)
    heard: list[str] = []
    with trio.fail_after(5):
        while "".join(heard) != " world":
            message = await again.receive()
            if message[0] == 0x10:
                heard.append(message[1:].decode())
