"""`/telephony/twilio` and its answer route, on the virtual network and clock (the echo engine).

The carrier's messages are Twilio's as its documentation shows them, and each
one the call sends is taken by Pipecat's ``TwilioFrameSerializer`` (the
independent reference) as the caller's audio or key; what the server sends
back is decoded with CPython's ``audioop`` and compared with what the caller
said, resampled by ``soxr`` here (``_helpers/twilio.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import urllib.parse
import wave
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import soxr
import trio

from _helpers.twilio import (
    ACCOUNT_SID,
    CALL_SID,
    PATH,
    STREAM_SID,
    TwilioCall,
    float_to_ulaw,
    now,
    reference_serializer,
    ulaw_to_float,
)
from pplex_trio.client import Refused
from pplex_trio.server import ServerSettings

RATE = 8_000
CHUNK = 160  # μ-law bytes in Twilio's 20 ms media message
FIRST_FRAME = ServerSettings().first_frame_timeout  # the default: the model's first step takes the first frame
TOKEN = "tele-token-4b1d9e0c7a"
TWILIO_AUTH = "twilio-auth-9f8e7d6c5b4a"


def speech_8k(path) -> np.ndarray:
    """``speech_assistant.wav`` (24 kHz PCM16) at the telephone's 8 kHz, resampled here by soxr."""
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24_000, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    return soxr.resample(pcm, 24_000, RATE).astype(np.float32)


async def talk(call: TwilioCall, audio: bytes) -> None:
    """``audio`` as Twilio sends it: 160 bytes every 20 ms."""
    deadline = trio.current_time()
    for i in range(0, len(audio), CHUNK):
        await call.media(audio[i : i + CHUNK])
        deadline += 0.02
        await trio.sleep_until(deadline)


async def listen(call: TwilioCall) -> None:
    while True:
        await call.next()


def best_correlation(piece: np.ndarray, received: np.ndarray) -> tuple[int, float]:
    """The lag at which ``piece`` best matches ``received``, and the Pearson correlation there."""
    best = (0, -1.0)
    for lag in range(0, received.size - piece.size, 4):
        window = received[lag : lag + piece.size]
        if window.std() == 0:
            continue
        corr = float(np.corrcoef(piece, window)[0, 1])
        if corr > best[1]:
            best = (lag, corr)
    return best


async def test_a_call_hears_its_caller_echoed_back_in_mulaw(virtual_server, autojump_clock, speech_wav):
    handle = await virtual_server(first_frame_timeout=FIRST_FRAME)
    speech = speech_8k(speech_wav)[3 * RATE : 6 * RATE]  # 3 s of real speech (the file opens with silence)
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        call = TwilioCall(ws, check=True)  # every media and dtmf we send, taken by Pipecat's serializer
        await call.open(persona="You answer the phone.", voice="NATF0.pt")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen, call)
            await talk(call, float_to_ulaw(speech) + float_to_ulaw(np.zeros(RATE // 2, np.float32)))
            nursery.cancel_scope.cancel()
    media = call.of("media")
    assert all(set(m) == {"event", "streamSid", "media"} and set(m["media"]) == {"payload"} for m in media)
    received = ulaw_to_float(call.audio())
    # One media message per 80 ms frame of the model (an 8 kHz frame is 640 samples, give or take the resampler's
    # blocks), as many as the caller's 3.5 s made.
    assert abs(received.size - len(media) * 640) <= 640 and abs(len(media) - 3.5 / 0.08) <= 2
    # Each half second of the caller's speech comes back, in order, in step (the echo's frame and the filters).
    half = RATE // 2
    lags = []
    for start in range(0, speech.size - half + 1, half):
        lag, corr = best_correlation(speech[start : start + half], received)
        assert corr > 0.9, (start, corr)
        lags.append(lag - start)
    assert max(lags) - min(lags) <= 8 and abs(lags[0] - 640) <= 40  # 80 ms: the echo's frame


async def test_when_the_caller_starts_speaking_clear_goes_out_then_a_frame_then_a_mark(
    virtual_server, autojump_clock, caplog
):
    caplog.set_level(logging.INFO, logger="pplex_trio")
    handle = await virtual_server()
    loud = (0.3 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)).astype(np.float32)
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        call = TwilioCall(ws, check=True)
        await call.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen, call)
            await talk(call, float_to_ulaw(np.zeros(RATE, np.float32)))  # a second of silence: no barge-in
            assert not call.of("clear")
            await talk(call, float_to_ulaw(loud))
            assert len(call.of("clear")) == 1
            await call.mark("barge-in-1")  # Twilio's echo of our mark: taken without a word
            await call.dtmf("5")
            await call.dtmf("7")
            await talk(call, float_to_ulaw(np.zeros(RATE // 2, np.float32)))
            nursery.cancel_scope.cancel()
    kinds = [e["event"] for e in call.received]
    at = kinds.index("clear")
    assert kinds[at : at + 3] == ["clear", "media", "mark"] and call.received[at + 2]["mark"] == {"name": "barge-in-1"}
    # The clear is the one the reference sends for an interruption.
    assert call.received[at] == json.loads(now(reference_serializer().serialize(_interruption())))
    assert kinds[at + 3 :].count("media") >= 10  # the call went on
    notices = [r.getMessage() for r in caplog.records if "(twilio): dtmf" in r.getMessage()]
    assert len(notices) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def _interruption():
    from pipecat.frames.frames import InterruptionFrame

    return InterruptionFrame()


async def test_stop_ends_the_call_and_frees_its_slot_at_once(virtual_server, autojump_clock):
    handle = await virtual_server(slots=1)
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        call = TwilioCall(ws)
        await call.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen, call)
            await talk(call, float_to_ulaw(np.zeros(RATE // 2, np.float32)))
            nursery.cancel_scope.cancel()
        assert (await handle.get_json("/health"))["slots_free"] == 0
        stopped = trio.current_time()
        await call.stop()
        code, _ = await call.until_closed()
        assert code == 1000
        while (await handle.get_json("/health"))["slots_free"] != 1:
            await trio.sleep(0.001)
        assert trio.current_time() - stopped < 0.08  # before the next tick
    assert 'pplex_sessions_ended_total{outcome="hangup",protocol="twilio"} 1.0' in await handle.metrics()


@pytest.mark.parametrize("seconds", [600])
async def test_ten_minutes_of_20_ms_frames_feed_the_model_exactly_and_the_output_stays_in_step(
    virtual_server, autojump_clock, seconds
):
    """At Twilio's pace on the virtual clock: 30,000 media messages in, one media message per tick out.

    Ten minutes, not an hour: every count on the way (samples pushed, the resampler's in and out, the framer's
    stream position) is a Python integer and the longest window the framing keeps is seconds, so nothing here
    drifts at a rate an hour would show and ten minutes not.  (An hour passed too, in 113 s on a busy machine:
    a third of the time of all of tests/server.)"""
    handle = await virtual_server(first_frame_timeout=FIRST_FRAME)
    rng = np.random.default_rng(3)
    chunks = [float_to_ulaw(rng.uniform(-0.5, 0.5, CHUNK).astype(np.float32)) for _ in range(50)]  # loud: no skip
    frames = seconds * 25 // 2  # 12.5 model frames a second
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        call = TwilioCall(ws)
        await call.open()
        out = 0

        async def count() -> None:
            nonlocal out
            while True:
                message = json.loads(await ws.get_message())
                out += message["event"] == "media"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(count)
            deadline = trio.current_time()
            for k in range(seconds * 50):
                await call.media(chunks[k % 50])
                deadline += 0.02
                await trio.sleep_until(deadline)
                if k % (50 * 120) == 50 * 120 - 1 or k == 50 * seconds - 1:  # every two minutes, and at the end:
                    assert abs(out - (k + 1) // 4) <= 2, (k, out)  # the output is in step with the input,
                    session = (await handle.get_json("/api/sessions"))["sessions"][0]  # and every tick had a frame
                    assert (session["input_underruns"], session["input_skipped_ms"], session["input_caught_up_ms"]) == (
                        0,
                        0,
                        0,
                    ), session
            for k in range(4):  # 80 ms more: the resampler's few ms of delay are through, the frame after is not
                await call.media(chunks[k])
                deadline += 0.02
                await trio.sleep_until(deadline)
            await trio.sleep(0.2)
            session = (await handle.get_json("/api/sessions"))["sessions"][0]
            nursery.cancel_scope.cancel()
    # Every whole frame of the caller's audio went to the model.
    assert session["frames_decoded"] == session["frames_consumed"] == frames
    assert session["call"] == {"id": CALL_SID, "stream": STREAM_SID, "account": ACCOUNT_SID}


async def start_witness(nursery, handle):
    witness = handle.witness(token=TOKEN)
    nursery.start_soon(witness.run)
    with trio.fail_after(10):
        await witness.ready.wait()
    return witness


async def witness_ends_whole(handle, witness) -> None:
    await trio.sleep(0.5)
    witness.stop.set()
    with trio.fail_after(10):
        while (await handle.get_json("/health"))["sessions"]:
            await trio.sleep(0.05)
    witness.check()  # every frame it sent came back


@pytest.mark.parametrize(
    "case, code, reason",
    [
        ("malformed", 1007, "malformed Twilio Media Streams event"),
        ("binary", 1003, "binary frames"),
        ("media_before_start", 1008, "media before the start event"),
        ("bad_persona", 1008, "text_prompt"),
        ("unknown_voice", 1008, "unknown voice"),
        ("wrong_token", 1008, "access token"),
        ("second_start", 1008, "a second start"),
    ],
)
async def test_a_bad_stream_is_closed_clearly_and_a_witness_goes_on(
    virtual_server, autojump_clock, nursery, caplog, case, code, reason
):
    handle = await virtual_server(auth_token=TOKEN, max_prompt_chars=50)
    witness = await start_witness(nursery, handle)
    async with handle.open_websocket(handle.ws_url + PATH, token=TOKEN) as ws:
        call = TwilioCall(ws)
        await call.connected()
        if case == "malformed":
            await call.start(token=TOKEN)
            await ws.send_message(json.dumps({"event": "media", "streamSid": STREAM_SID, "media": {"payload": "%%"}}))
        elif case == "binary":
            await ws.send_message(b"\x00\x01")
        elif case == "media_before_start":
            await call.media(bytes(CHUNK))
        elif case == "bad_persona":
            await call.start(token=TOKEN, text_prompt="x" * 51)
        elif case == "unknown_voice":
            await call.start(token=TOKEN, voice="nobody.pt")
        elif case == "wrong_token":
            await call.start(token=TOKEN + "x")
        else:
            await call.start(token=TOKEN)
            await call.start(token=TOKEN)
        closed, text = await call.until_closed()
    assert closed == code and reason in text
    if case in ("bad_persona", "unknown_voice", "wrong_token", "media_before_start"):
        assert not call.of("media")  # refused before it took a slot
    await witness_ends_whole(handle, witness)
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert TOKEN not in log and not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_the_stream_needs_no_token_in_its_url_but_in_its_start(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    with pytest.raises(Refused) as refused:  # every other conversation path still needs it
        async with handle.open_websocket(handle.ws_url + "/v1/realtime"):
            pass
    assert refused.value.status == 401
    async with handle.open_websocket(handle.ws_url + PATH) as ws:  # as Twilio connects: no token in the URL
        call = TwilioCall(ws)
        await call.open(token=TOKEN)
        await call.media(bytes(CHUNK) * 4)
        assert (await call.next())["event"] == "media"


def signed(url: str, form: dict[str, str] | None = None) -> str:
    """Twilio's signature, computed here from its documentation: HMAC-SHA1 over the URL and the sorted form."""
    data = url + "".join(k + v for k, v in sorted((form or {}).items()))
    return base64.b64encode(hmac.new(TWILIO_AUTH.encode(), data.encode(), hashlib.sha1).digest()).decode()


def parse_answer(text: str) -> tuple[str, dict[str, str]]:
    root = ET.fromstring(text)
    assert root.tag == "Response" and [c.tag for c in root] == ["Connect"]
    stream = root.find("./Connect/Stream")
    assert stream is not None
    return stream.get("url"), {p.get("name"): p.get("value") for p in stream.findall("Parameter")}


async def test_the_answer_points_the_call_at_our_stream_with_persona_voice_and_token(virtual_server, autojump_clock):
    handle = await virtual_server(auth_token=TOKEN)
    persona = 'You are "Ada" & you <help>.'
    query = urllib.parse.urlencode({"token": TOKEN, "persona": persona, "voice": "NATM1.pt"})
    async with handle.http() as http:
        answer = await http.get(f"/telephony/twilio/answer?{query}")
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/xml")
        url, parameters = parse_answer(answer.text)
        assert url == f"ws://127.0.0.1:{handle.port}/telephony/twilio"
        assert parameters == {"persona": persona, "voice": "NATM1.pt", "token": TOKEN}
        # Behind a TLS proxy: wss, and the host the carrier used.
        answer = await http.post(
            f"/telephony/twilio/answer?{query}",
            data={"CallSid": "CA1"},
            headers={"X-Forwarded-Proto": "https", "X-Forwarded-Host": "voice.example.com"},
        )
        assert parse_answer(answer.text)[0] == "wss://voice.example.com/telephony/twilio"
        bad = await http.get(
            "/telephony/twilio/answer?" + urllib.parse.urlencode({"token": TOKEN, "persona": "x" * 2000})
        )
        assert bad.status_code == 400 and "persona" in bad.json()["error"]
        bad = await http.get("/telephony/twilio/answer?" + urllib.parse.urlencode({"token": TOKEN, "voice": "../x"}))
        assert bad.status_code == 400 and "voice" in bad.json()["error"]
        assert (await http.get("/telephony/twilio/answer")).status_code == 401  # the token, as everywhere
    # What the answer gives the stream opens a call.
    async with handle.open_websocket(handle.ws_url + PATH) as ws:
        call = TwilioCall(ws)
        await call.open(**parameters)
        await call.media(bytes(CHUNK) * 4)
        assert (await call.next())["event"] == "media"


async def test_with_a_twilio_auth_token_only_signed_requests_are_answered(virtual_server, autojump_clock):
    handle = await virtual_server(twilio_auth_token=TWILIO_AUTH)
    path = "/telephony/twilio/answer?persona=Hi"
    url = f"http://127.0.0.1:{handle.port}{path}"
    form = {"CallSid": "CA1", "From": "+14155550100", "To": "+14155550199", "AccountSid": "AC1"}
    async with handle.http() as http:
        good = await http.post(path, data=form, headers={"X-Twilio-Signature": signed(url, form)})
        assert good.status_code == 200 and parse_answer(good.text)[1] == {"persona": "Hi"}
        assert (await http.get(path, headers={"X-Twilio-Signature": signed(url)})).status_code == 200
        for headers in ({}, {"X-Twilio-Signature": signed(url, {**form, "To": "+1"})}):
            refused = await http.post(path, data=form, headers=headers)
            assert refused.status_code == 403 and "X-Twilio-Signature" in refused.json()["error"]
    stream_url = f"ws://127.0.0.1:{handle.port}{PATH}"
    for headers in ([], [("X-Twilio-Signature", signed(stream_url + "x"))]):
        with pytest.raises(Refused) as refused:
            async with handle.open_websocket(handle.ws_url + PATH, headers=headers):
                pass
        assert refused.value.status == 403
    async with handle.open_websocket(handle.ws_url + PATH, headers=[("X-Twilio-Signature", signed(stream_url))]) as ws:
        call = TwilioCall(ws)
        await call.open()
        await call.media(bytes(CHUNK) * 4)
        assert (await call.next())["event"] == "media"
