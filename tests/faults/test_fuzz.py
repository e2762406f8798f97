"""Protocol fuzzing: random client messages against the session core, on a fake socket.

Every sequence must end in a documented close code (1000, 1003, 1007, 1008,
1009) or be ignored, never in an internal error, on the raw, Moshi, Live,
Twilio, Telnyx, Plivo and Exotel protocols: message kinds and lengths up to the limit and just past it, Ogg
streams with corrupted pages, wrong CRCs and chained streams, JSON of random
shape and depth, Live and carriers' events with random fields; and every Live server event
is one the openai SDK's types accept.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import sphn
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _helpers import ogg
from _helpers.fake_ws import running_host, start_session
from _helpers.live import checked
from pplex_trio._conversation import Outcome

LIMIT = 4096
DOCUMENTED = {1000, 1003, 1007, 1008, 1009}


def _ogg_pages() -> list[bytes]:
    writer = sphn.OpusStreamWriter(24000)
    tone = (0.3 * np.sin(np.arange(1920 * 3) / 5)).astype(np.float32)
    return [p for i in range(3) for p in ogg.split_pages(writer.append_pcm(tone[i * 1920 : (i + 1) * 1920]))]


PAGES = _ogg_pages()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
open_params = st.dictionaries(
    st.sampled_from(
        [
            "persona",
            "voice",
            "text_prompt",
            "voice_prompt",
            "text_temperature",
            "text_topk",
            "audio_seed",
            "repetition_penalty",
            "pad_mult",
            "x",
        ]
    ),
    json_values,
    max_size=4,
)


@st.composite
def raw_messages(draw) -> bytes | str:
    kind = draw(st.sampled_from(["open", "close", "json", "deep", "pcm", "bytes", "big"]))
    if kind == "open":
        return json.dumps({"type": "open", **draw(open_params)}, allow_nan=True)
    if kind == "close":
        return json.dumps({"type": "close"})
    if kind == "json":
        return json.dumps(draw(json_values), allow_nan=True)
    if kind == "deep":
        depth = draw(st.integers(1, 100_000 // 8))
        return "[" * depth + "]" * draw(st.sampled_from([0, depth]))
    if kind == "pcm":
        samples = draw(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=64))
        return np.array(samples, dtype="<f4").tobytes()
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    return bytes(draw(st.sampled_from([LIMIT - 1, LIMIT, LIMIT + 1, LIMIT + 4])))


@st.composite
def moshi_messages(draw) -> bytes | str:
    kind = draw(st.sampled_from(["page", "corrupt", "crc", "chained", "truncated", "kind", "text", "empty", "big"]))
    if kind == "page":
        return b"\x01" + draw(st.sampled_from(PAGES))
    if kind == "corrupt":
        page = bytearray(draw(st.sampled_from(PAGES)))
        at = draw(st.integers(0, len(page) - 1))
        page[at] ^= draw(st.integers(1, 255))
        return b"\x01" + bytes(page)
    if kind == "crc":
        page = bytearray(draw(st.sampled_from(PAGES)))
        page[22:26] = bytes(4)
        return b"\x01" + bytes(page)
    if kind == "chained":
        return b"\x01" + b"".join(PAGES[:2]) + b"".join(_ogg_pages()[:3])
    if kind == "truncated":
        page = draw(st.sampled_from(PAGES))
        return b"\x01" + page[: draw(st.integers(1, len(page) - 1))]
    if kind == "kind":
        return bytes([draw(st.integers(0, 255))]) + draw(st.binary(max_size=32))
    if kind == "text":
        return draw(st.text(max_size=32))
    if kind == "empty":
        return b""
    return b"\x01" + bytes(draw(st.sampled_from([LIMIT - 1, LIMIT, LIMIT + 1])) - 1)


LIVE_KINDS = [
    "session.start",
    "session.input_audio.append",
    "session.input_audio.mute",
    "session.input_audio.unmute",
    "session.close",
    "session.update",
    "session.commentary.append",
    "response.create",
    "x",
]


@st.composite
def live_messages(draw) -> bytes | str:
    kind = draw(st.sampled_from(["event", "start", "audio", "json", "bytes"]))
    if kind == "json":
        return json.dumps(draw(json_values), allow_nan=True)
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "audio":
        audio = draw(st.binary(max_size=96))
        return json.dumps({"type": "session.input_audio.append", "audio": base64.b64encode(audio).decode()})
    if kind == "start":
        audio = {
            "format": draw(
                st.fixed_dictionaries(
                    {
                        "type": st.sampled_from(["audio/pcm", "audio/pcmu", "audio/pcma", "x"]),
                        "rate": st.sampled_from([8000, 16000, 24000, 0]),
                    }
                )
            ),
            "output": {"voice": draw(json_values | st.sampled_from(["marin", "NATF0.pt"]))},
        }
        session = {
            "model": draw(json_values),
            "instructions": draw(json_values),
            "audio": audio,
            "delegation": draw(json_values),
            "input": draw(json_values),
        }
        return json.dumps({"type": "session.start", "session": session, "event_id": draw(json_values)}, allow_nan=True)
    fields = draw(
        st.dictionaries(
            st.sampled_from(["event_id", "audio", "content", "session", "delegation_id"]), json_values, max_size=3
        )
    )
    return json.dumps({**fields, "type": draw(st.sampled_from(LIVE_KINDS))}, allow_nan=True)


# The parameters a carrier's start hands on (persona, voice, token), and media payloads, well-formed or not.
carrier_parameters = st.dictionaries(
    st.sampled_from(["persona", "voice", "text_prompt", "voice_prompt", "token", "text_temperature", "x"]),
    st.text(max_size=20),
    max_size=3,
)
payloads = st.binary(max_size=1600).map(lambda b: base64.b64encode(b).decode()) | json_values


def carrier_messages(starts, media, events: list[str], fields: list[str]):
    """A carrier's events, well-formed or not: its ``starts`` and ``media`` (strategies of its own events), any of
    its ``events`` with stray ``fields``, any JSON, any bytes."""
    others = st.builds(
        lambda extra, kind: {**extra, "event": kind},
        st.dictionaries(st.sampled_from(fields), json_values, max_size=2),
        st.sampled_from(events),
    )
    as_text = (starts | media | others).map(lambda event: json.dumps(event, allow_nan=True))
    return as_text | json_values.map(lambda value: json.dumps(value, allow_nan=True)) | st.binary(max_size=64)


# Twilio: starts with random parameters and formats, media of any bytes.
twilio_messages = carrier_messages(
    st.fixed_dictionaries(
        {
            "event": st.just("start"),
            "start": st.fixed_dictionaries(
                {
                    "streamSid": st.sampled_from(["MZ1", 5, None]),
                    "callSid": st.just("CA1"),
                    "customParameters": st.dictionaries(
                        st.sampled_from(
                            ["persona", "voice", "text_prompt", "voice_prompt", "token", "text_temperature", "x"]
                        ),
                        st.text(max_size=20) | json_values,
                        max_size=3,
                    ),
                    "mediaFormat": st.fixed_dictionaries(
                        {
                            "encoding": st.sampled_from(["audio/x-mulaw", "audio/x-alaw", "audio/l16", 5]),
                            "sampleRate": st.sampled_from([8000, 16000, "8000"]),
                        }
                    )
                    | json_values,
                }
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "event": st.just("media"),
            "media": st.fixed_dictionaries(
                {
                    "payload": st.binary(max_size=400).map(lambda b: base64.b64encode(b).decode()) | json_values,
                    "track": st.sampled_from(["inbound", "outbound", None]),
                }
            ),
        }
    ),
    ["connected", "start", "media", "mark", "dtmf", "stop", "x"],
    ["mark", "dtmf", "media", "start", "stop"],
)

# Telnyx: starts with random ids, parameters and formats, media of any bytes.
telnyx_messages = carrier_messages(
    st.fixed_dictionaries(
        {
            "event": st.just("start"),
            "stream_id": st.sampled_from(["S1", 5, None]),
            "start": st.fixed_dictionaries(
                {
                    "call_control_id": st.sampled_from(["v3:C1", 5, None]),
                    "custom_parameters": carrier_parameters,
                    "media_format": st.fixed_dictionaries(
                        {
                            "encoding": st.sampled_from(["PCMU", "PCMA", "audio/x-mulaw", "L16", 5]),
                            "sample_rate": st.sampled_from([8000, 16000, "8000"]),
                            "channels": st.sampled_from([1, 2]),
                        }
                    )
                    | json_values,
                }
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "event": st.just("media"),
            "media": st.fixed_dictionaries(
                {"payload": payloads, "track": st.sampled_from(["inbound", "inbound_track", "outbound", None])}
            ),
        }
    ),
    ["connected", "start", "media", "mark", "dtmf", "stop", "error", "x"],
    ["mark", "dtmf", "media", "start", "stop", "payload"],
)

# Plivo: starts with random formats and extra headers (any of their shapes), media of any bytes (odd lengths too,
# for 16-bit PCM).
plivo_messages = carrier_messages(
    st.fixed_dictionaries(
        {
            "event": st.just("start"),
            "start": st.fixed_dictionaries(
                {
                    "callId": st.just("C1"),
                    "streamId": st.sampled_from(["S1", 5, None]),
                    "mediaFormat": st.fixed_dictionaries(
                        {
                            "encoding": st.sampled_from(["audio/x-mulaw", "audio/x-l16", "audio/x-alaw", 5]),
                            "sampleRate": st.sampled_from([8000, 16000, 24000, "8000", 8000.0, True]),
                        }
                    )
                    | json_values,
                }
            ),
            "extra_headers": carrier_parameters.map(json.dumps)
            | st.text(max_size=40)
            | carrier_parameters
            | json_values,
        }
    ),
    st.fixed_dictionaries(
        {
            "event": st.just("media"),
            "media": st.fixed_dictionaries(
                {"payload": payloads, "track": st.sampled_from(["inbound", "outbound", None])}
            ),
        }
    ),
    ["start", "media", "playedStream", "clearedAudio", "dtmf", "stop", "x"],
    ["name", "dtmf", "media", "start", "streamId"],
)

# Exotel: starts with random rates (strings, numbers, nonsense) and encodings, media of any bytes (odd lengths too:
# its audio is 16-bit PCM).
exotel_messages = carrier_messages(
    st.fixed_dictionaries(
        {
            "event": st.just("start"),
            "start": st.fixed_dictionaries(
                {
                    "stream_sid": st.sampled_from(["S1", 5, None]),
                    "call_sid": st.just("C1"),
                    "custom_parameters": carrier_parameters,
                    "media_format": st.fixed_dictionaries(
                        {
                            "encoding": st.sampled_from(["audio/x-raw", "base64", "slin", "audio/x-mulaw", 5]),
                            "sample_rate": st.sampled_from(
                                ["8000", "16000", "24000", 8000, "44100", 8000.0, True, "x"]
                            ),
                        }
                    )
                    | json_values,
                }
            ),
        }
    ),
    st.fixed_dictionaries(
        {"event": st.just("media"), "media": st.fixed_dictionaries({"payload": payloads, "chunk": st.just("1")})}
    ),
    ["connected", "start", "media", "mark", "dtmf", "stop", "clear", "x"],
    ["mark", "dtmf", "media", "start", "stop"],
)


def run_session(protocol: str, messages: list[bytes | str]) -> tuple[object, int]:
    """Feed ``messages`` to one session; return how it ended and how many internal errors were counted (a Live
    session's server events each checked against the openai SDK's types)."""

    async def main():
        async with trio.open_nursery() as nursery:
            host = await running_host(patch, nursery, slots=1, model="echo:delay=1,prompt=1", max_message_bytes=LIMIT)
            run = await start_session(nursery, host, protocol)
            if protocol == "moshi":
                await run.ws.wait_for(lambda sent: b"\x00" in sent)
            for message in messages:
                run.ws.client_send(message)
                await trio.sleep(0.02)
            if protocol == "raw":
                run.ws.client_send(json.dumps({"type": "close"}))
            with trio.move_on_after(10):
                await run.done.wait()
            errors = host.metrics.errors.labels("session")._value.get()
            ending = run.session.ending
            if protocol == "live":
                for sent in run.ws.sent:
                    checked(sent)
            nursery.cancel_scope.cancel()
            return ending, errors

    with pytest.MonkeyPatch.context() as patch:  # (hypothesis runs many examples in one test: no fixture)
        return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


fuzz = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ends_in_a_documented_way_or_goes_on(protocol: str, messages: list[bytes | str]) -> None:
    ending, errors = run_session(protocol, messages)
    assert errors == 0
    if ending is not None:  # else: every message was taken, answered or ignored, and the conversation went on
        assert ending.outcome is not Outcome.INTERNAL_ERROR and ending.code in DOCUMENTED, ending


@fuzz
@given(st.lists(raw_messages(), min_size=1, max_size=6))
def test_raw_sessions_end_in_a_documented_way(messages):
    ending, errors = run_session("raw", messages)
    assert errors == 0
    assert ending is not None and ending.outcome is not Outcome.INTERNAL_ERROR, ending
    assert ending.code in DOCUMENTED, ending


# The protocols whose sessions may go on after a bad message (a raw session always ends: above).
GOING_ON = {
    "moshi": moshi_messages(),
    "live": live_messages(),
    "twilio": twilio_messages,
    "telnyx": telnyx_messages,
    "plivo": plivo_messages,
    "exotel": exotel_messages,
}


@pytest.mark.parametrize("protocol", GOING_ON)
@fuzz
@given(data=st.data())
def test_sessions_end_in_a_documented_way_or_go_on(protocol, data):
    ends_in_a_documented_way_or_goes_on(protocol, data.draw(st.lists(GOING_ON[protocol], min_size=1, max_size=6)))
