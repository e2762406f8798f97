"""The Live protocol's codec on its own (sans-IO): client events parsed, session.start checked, server events
shaped as the openai SDK's types say."""

from __future__ import annotations

import base64
import json

import pytest

from _helpers.live import checked
from pplex_trio.protocol import (
    AudioAppend,
    ClientEvent,
    CloseCode,
    Encoding,
    EventError,
    LiveEvents,
    ProtocolError,
    SampleFormat,
    live,
)

VOICES = ["NATF0.pt", "NATF2.pt", "custom.wav"]


def start(**session):
    return live.start_config(session, default_model="echo", max_prompt_chars=50, voices=VOICES, event_id="e1")


def test_session_start_defaults():
    config, not_applied = start()
    assert config == live.LiveConfig(
        model="echo", instructions="", voice=None, audio_format=SampleFormat(Encoding.PCM16, 24_000)
    )
    assert not_applied == []
    assert config.conversation().persona == ""


@pytest.mark.parametrize(
    "value, expected",
    [
        ({"type": "audio/pcm", "rate": 24000}, SampleFormat(Encoding.PCM16, 24000)),
        ({"type": "audio/pcm", "rate": 16000}, SampleFormat(Encoding.PCM16, 16000)),
        ({"type": "audio/pcm"}, SampleFormat(Encoding.PCM16, 24000)),
        ({"type": "audio/pcmu", "rate": 8000}, SampleFormat(Encoding.PCMU, 8000)),
        ({"type": "audio/pcma"}, SampleFormat(Encoding.PCMA, 8000)),
    ],
)
def test_the_audio_formats_live_has(value, expected):
    assert start(audio={"format": value})[0].audio_format == expected


@pytest.mark.parametrize(
    "value",
    [
        {"type": "audio/pcm", "rate": 8000},
        {"type": "audio/pcmu", "rate": 16000},
        {"type": "audio/opus"},
        "audio/pcm",
        [],
        {"rate": 24000},
    ],
)
def test_other_formats_are_refused_naming_the_field(value):
    with pytest.raises(EventError) as refused:
        start(audio={"format": value})
    assert refused.value.param == "session.audio.format" and refused.value.event_id == "e1"


def test_voices_openai_names_ids_and_unknown_ones():
    assert start(audio={"output": {"voice": "marin"}})[0].voice == "NATF2.pt"
    assert start(audio={"output": {"voice": {"id": "custom.wav"}}})[0].voice == "custom.wav"
    assert start(audio={"output": {"voice": "shimmer"}})[0].voice is None  # OpenAI's, not on this server
    config, (unknown,) = start(audio={"output": {"voice": {"id": "nobody.pt"}}})
    assert config.voice is None and "nobody.pt" in unknown.message and unknown.code == "unknown_voice"


def test_instructions_are_checked_as_on_every_endpoint():
    assert start(instructions="  Be kind.  ")[0].instructions == "Be kind."
    for bad in ("x" * 51, 5, "a\x00b"):
        with pytest.raises(EventError) as refused:
            start(instructions=bad)
        assert refused.value.param == "session.instructions"


def test_what_a_session_can_start_without_is_told_not_refused():
    assert start(delegation={"type": "client"}, model="gpt-live-1")[1] == []
    _, not_applied = start(
        delegation={"type": "responses", "responses": {"tools": [{"type": "function"}]}},
        input=[{"type": "message"}],
        triggers=[{"type": "x"}],
    )
    assert [e.param for e in not_applied] == ["session.delegation", "session.input", "session.triggers"]
    assert start(model=7)[0].model == "echo" and start(model="gpt-live-1")[0].model == "gpt-live-1"


def test_client_events():
    audio = base64.b64encode(b"\x01\x02").decode()
    event = live.parse_client_event(json.dumps({"type": "session.input_audio.append", "audio": audio, "event_id": "a"}))
    assert event == AudioAppend("session.input_audio.append", "a", b"\x01\x02")
    assert live.parse_client_event('{"type": "session.close"}') == ClientEvent("session.close", None)
    with pytest.raises(ProtocolError) as binary:
        live.parse_client_event(b"{}")
    assert binary.value.code == CloseCode.UNSUPPORTED_DATA
    for message, code in [
        ('{"type": "session.update", "event_id": 3}', "unsupported_event"),
        ('{"type": "nope"}', "invalid_event_type"),
        ("{", "invalid_json"),
        ('{"type": "session.start", "session": []}', "invalid_value"),
    ]:
        with pytest.raises(EventError) as refused:
            live.parse_client_event(message)
        assert refused.value.code == code and refused.value.event_id is None


def test_server_events_are_the_sdks():
    events = LiveEvents(session_id="sess_1", expires_at=0)
    config, _ = start(instructions="Hi.", audio={"format": {"type": "audio/pcmu"}})
    made = [
        events.started(config, "e1"),
        events.closed("close_requested", config, 1.2, None),
        events.usage(5.0),
        events.muted(True, "m"),
        events.muted(False, None),
        events.info("queued", "number 1"),
        events.error("bad", code="invalid_json", client_event_id="x"),
        events.audio_delta(b"\x00\x01"),
        events.transcript_delta(" hi", 80, 160),
    ]
    parsed = [checked(event) for event in made]
    ids = [event["event_id"] for event in parsed if "event_id" in event]
    assert len(ids) == len(set(ids)) == len(made) - 1  # all but the audio delta
    assert parsed[0]["session"]["audio"]["format"] == {"type": "audio/pcmu", "rate": 8000}
    assert parsed[6]["client_event_id"] == parsed[6]["error"]["client_event_id"] == "x"
