"""`/telephony/telnyx`, `/telephony/plivo`, `/telephony/exotel` and their answer routes, on the virtual network
and clock (the echo engine).

The carrier's messages are its own as its documentation shows them, and each
one the call sends is taken by the carrier's Pipecat serializer (the
independent reference) as the caller's audio or key; our ``clear`` equals the
serializer's, and our media message has the serializer's shape.  What the
server sends back is decoded with ``audioop`` or numpy and compared with what
the caller said, resampled by ``soxr`` here (``_helpers/carriers.py``).
"""

from __future__ import annotations

import json
import logging
import urllib.parse
import wave
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import soxr
import trio

from _helpers.carriers import STREAM_ID, WIRES, CarrierCall, reference_clear, reference_media, shape
from pplex_trio.server import ServerSettings

RATE = 8_000
TOKEN = "tele-token-4b1d9e0c7a"
FIRST_FRAME = ServerSettings().first_frame_timeout  # the default: the model's first step takes the first frame
CARRIERS = list(WIRES)


@pytest.fixture(params=CARRIERS)
def wire(request):
    return WIRES[request.param]


def speech_8k(path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24_000, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    return soxr.resample(pcm, 24_000, RATE).astype(np.float32)


def best_correlation(piece: np.ndarray, received: np.ndarray) -> tuple[int, float]:
    best = (0, -1.0)
    for lag in range(0, received.size - piece.size, 4):
        window = received[lag : lag + piece.size]
        if window.std() > 0:
            corr = float(np.corrcoef(piece, window)[0, 1])
            if corr > best[1]:
                best = (lag, corr)
    return best


async def test_a_call_hears_its_caller_echoed_back(virtual_server, autojump_clock, speech_wav, wire):
    handle = await virtual_server(first_frame_timeout=FIRST_FRAME)
    speech = speech_8k(speech_wav)[3 * RATE : 6 * RATE]  # 3 s of real speech
    pause = np.zeros(RATE // 2, np.float32)
    async with handle.open_websocket(handle.ws_url + wire.path) as ws:
        call = CarrierCall(wire, ws, check=True)
        await call.open(persona="You answer the phone.", voice="NATF0.pt")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.listen)
            await call.talk(np.concatenate([pause, speech, pause]))  # (the caller speaks once the call is on)
            nursery.cancel_scope.cancel()
    media = call.of(wire.media)
    reference = reference_media(wire, speech[:640])
    assert all(
        shape(m) == {**shape(reference), **({wire.stream_key: STREAM_ID} if wire.stream_key else {})} for m in media
    ), (media[0], reference)
    received = call.audio()
    assert abs(received.size - len(media) * 640) <= 640 and abs(len(media) - (speech.size / RATE + 1.0) / 0.08) <= 2
    half = RATE // 2
    lags = []
    for start in range(0, speech.size - half + 1, half):
        lag, corr = best_correlation(speech[start : start + half], received)
        assert corr > 0.9, (start, corr)
        lags.append(lag - pause.size - start)
    # 80 ms: the echo's frame; with Exotel's 100 ms messages one silent frame more at most, in the pause (the grid
    # starts on the caller's first frame and its second tick comes before the second message).
    most = 640 if wire.chunk_seconds < 0.08 else 2 * 640
    assert max(lags) - min(lags) <= 8 and 640 - 40 <= lags[0] <= most + 40, lags


async def test_when_the_caller_starts_speaking_the_carriers_clear_goes_out(
    virtual_server, autojump_clock, caplog, wire
):
    caplog.set_level(logging.INFO, logger="pplex_trio")
    handle = await virtual_server()
    loud = (0.3 * np.sin(2 * np.pi * 440 * np.arange(RATE) / RATE)).astype(np.float32)
    async with handle.open_websocket(handle.ws_url + wire.path) as ws:
        call = CarrierCall(wire, ws, check=True)
        await call.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.listen)
            await call.talk(np.zeros(RATE, np.float32))
            assert not call.of(wire.clear)
            await call.talk(loud)
            assert len(call.of(wire.clear)) == 1
            await call.send(wire.mark_echo("barge-in-1"))
            await call.send(wire.dtmf("5"))
            await call.talk(np.zeros(RATE // 2, np.float32))
            nursery.cancel_scope.cancel()
    kinds = [e["event"] for e in call.received]
    at = kinds.index(wire.clear)
    assert kinds[at : at + 3] == [wire.clear, wire.media, wire.mark]
    mark = call.received[at + 2]
    assert mark.get("name", mark.get("mark", {}).get("name")) == "barge-in-1"
    assert call.received[at] == reference_clear(wire)  # the clear the reference sends for an interruption
    assert kinds[at + 3 :].count(wire.media) >= 5
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_stop_ends_the_call_and_frees_its_slot(virtual_server, autojump_clock, wire):
    handle = await virtual_server(slots=1)
    async with handle.open_websocket(handle.ws_url + wire.path) as ws:
        call = CarrierCall(wire, ws)
        await call.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.listen)
            await call.talk(np.zeros(RATE // 2, np.float32))
            nursery.cancel_scope.cancel()
        assert (await handle.get_json("/health"))["slots_free"] == 0
        stopped = trio.current_time()
        await call.send(wire.stop())
        code, _ = await call.until_closed()
        assert code == 1000
        while (await handle.get_json("/health"))["slots_free"] != 1:
            await trio.sleep(0.001)
        assert trio.current_time() - stopped < 0.08
    assert f'pplex_sessions_ended_total{{outcome="hangup",protocol="{wire.name}"}} 1.0' in await handle.metrics()


@pytest.mark.parametrize(
    "case, code, reason",
    [
        ("malformed", 1007, "malformed"),
        ("binary", 1003, "binary frames"),
        ("media_before_start", 1008, "media before the start event"),
        ("wrong_token", 1008, "access token"),
        ("bad_format", 1003, "unsupported media format"),
    ],
)
async def test_a_bad_stream_is_closed_clearly(virtual_server, autojump_clock, caplog, wire, case, code, reason):
    handle = await virtual_server(auth_token=TOKEN)
    async with handle.open_websocket(handle.ws_url + wire.path) as ws:
        call = CarrierCall(wire, ws)
        if case == "malformed":
            await call.open(token=TOKEN)
            await ws.send_message(json.dumps(wire.media_event(5, "%%")))
        elif case == "binary":
            await ws.send_message(b"\x00\x01")
        elif case == "media_before_start":
            await call.media(bytes(320))
        elif case == "wrong_token":
            await call.send(wire.start({"token": TOKEN + "x"}))
        else:
            await call.send(wire.start({"token": TOKEN}, "audio/x-opus"))
        closed, text = await call.until_closed()
    assert closed == code and reason in text, (closed, text)
    if case != "malformed":
        assert not call.of(wire.media)
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert TOKEN not in log and not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def stream_of(wire, text: str) -> tuple[str, dict[str, str]]:
    """The stream URL and the parameters an answer document gives the call, read as the carrier reads it."""
    if wire.name == "telnyx":
        root = ET.fromstring(text)
        stream = root.find("./Connect/Stream")
        assert root.tag == "Response" and stream is not None
        assert (stream.get("bidirectionalMode"), stream.get("bidirectionalCodec")) == ("rtp", "PCMU")
        return stream.get("url"), {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
    if wire.name == "plivo":
        root = ET.fromstring(text)
        assert root.tag == "Response" and [c.tag for c in root] == ["Stream"]
        stream = root[0]
        assert (stream.get("bidirectional"), stream.get("keepCallAlive"), stream.get("contentType")) == (
            "true",
            "true",
            "audio/x-mulaw;rate=8000",
        )
        url = stream.text.strip()
    else:
        url = json.loads(text)["url"]
    base, _, query = url.partition("?")
    return base, dict(urllib.parse.parse_qsl(query))


async def test_the_answer_points_the_call_at_our_stream_with_persona_voice_and_token(
    virtual_server, autojump_clock, wire
):
    handle = await virtual_server(auth_token=TOKEN)
    persona = 'You are "Ada" & you <help>.'
    query = urllib.parse.urlencode({"token": TOKEN, "persona": persona, "voice": "NATM1.pt"})
    answer_path = f"{wire.path}/answer"
    async with handle.http() as http:
        answer = await http.get(f"{answer_path}?{query}")
        assert answer.status_code == 200
        url, parameters = stream_of(wire, answer.text)
        assert url == f"ws://127.0.0.1:{handle.port}{wire.path}"
        assert parameters == {"persona": persona, "voice": "NATM1.pt", "token": TOKEN}
        answer = await http.post(
            f"{answer_path}?{query}",
            data={"CallSid": "CA1"},
            headers={"X-Forwarded-Proto": "https", "X-Forwarded-Host": "voice.example.com"},
        )
        assert stream_of(wire, answer.text)[0] == f"wss://voice.example.com{wire.path}"
        bad = await http.get(f"{answer_path}?" + urllib.parse.urlencode({"token": TOKEN, "voice": "../x"}))
        assert bad.status_code == 400 and "voice" in bad.json()["error"]
        assert (await http.get(answer_path)).status_code == 401
    # What the answer gives the stream opens a call, as the carrier would open it.
    if wire.name == "telnyx":
        path, start_parameters = wire.path, parameters  # the <Parameter>s come back in the start event
    else:  # the URL's query: Exotel hands it to the start's custom_parameters as well; Plivo only keeps the URL
        path = f"{wire.path}?{urllib.parse.urlencode(parameters)}"
        start_parameters = parameters if wire.name == "exotel" else {}
    async with handle.open_websocket(handle.ws_url + path) as ws:
        call = CarrierCall(wire, ws)
        await call.open(**start_parameters)
        await call.media(wire.encode(np.zeros(640, np.float32)))
        assert (await call.next())["event"] == wire.media
