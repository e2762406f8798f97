"""The Realtime event codec on its own: every client event parsed, every server event built.

Server events are checked against the ``openai`` SDK's own models (its
``RealtimeServerEvent`` unions, GA and beta): an independent statement of the
protocol.
"""

from __future__ import annotations

import base64
import json

import pytest
from pydantic import TypeAdapter

from pplex_trio.protocol import ProtocolError
from pplex_trio.protocol._realtime import (AudioAppend, AudioFormat, ClientEvent, Dialect, RealtimeError,
                                           ServerEvents, SessionConfig, SessionUpdate, apply_session_update,
                                           parse_client_event)

openai_ga = pytest.importorskip("openai.types.realtime")
openai_beta = pytest.importorskip("openai.types.beta.realtime")
UNIONS = {Dialect.GA: TypeAdapter(openai_ga.RealtimeServerEvent),
          Dialect.BETA: TypeAdapter(openai_beta.RealtimeServerEvent)}
VOICES = ["NATF0.pt", "NATF2.pt", "VARM1.pt"]


def parse(event: dict | str) -> ClientEvent:
    return parse_client_event(event if isinstance(event, str) else json.dumps(event), max_bytes=1 << 20)


# -- client events ------------------------------------------------------------------------


def test_every_supported_client_event_is_parsed():
    update = parse({"type": "session.update", "event_id": "e1", "session": {"instructions": "x"}})
    assert update == SessionUpdate("session.update", "e1", {"instructions": "x"})
    append = parse({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x02").decode()})
    assert append == AudioAppend("input_audio_buffer.append", None, b"\x01\x02")
    for kind in ("input_audio_buffer.commit", "input_audio_buffer.clear", "response.create", "response.cancel",
                 "output_audio_buffer.clear"):
        assert parse({"type": kind, "event_id": 7}) == ClientEvent(kind, None)  # a non-string id is dropped


@pytest.mark.parametrize("message, param, code", [
    ("not json", None, "invalid_json"),
    ("[1, 2]", "type", "invalid_event"),
    ('{"type": 5}', "type", "invalid_event"),
    ('{"type": "nonsense.event"}', "type", "invalid_event_type"),
    ('{"type": "conversation.item.create", "item": {}}', "type", "unsupported_event"),
    ('{"type": "conversation.item.truncate"}', "type", "unsupported_event"),
    ('{"type": "input_audio_buffer.append", "audio": "***"}', "audio", "invalid_value"),
    ('{"type": "input_audio_buffer.append", "audio": "QUJ"}', "audio", "invalid_value"),  # bad padding
    ('{"type": "input_audio_buffer.append"}', "audio", "invalid_value"),
])
def test_bad_client_events_are_errors_that_name_the_field(message, param, code):
    with pytest.raises(RealtimeError) as error:
        parse(message)
    assert (error.value.param, error.value.code) == (param, code)


def test_binary_and_oversized_messages_end_the_session():
    with pytest.raises(ProtocolError) as binary:
        parse_client_event(b"\x00", max_bytes=100)
    assert binary.value.code == 1003
    with pytest.raises(ProtocolError) as big:
        parse_client_event("x" * 101, max_bytes=100)
    assert big.value.code == 1009


# -- session updates --------------------------------------------------------------------------


def update(session: dict, config: SessionConfig = SessionConfig(), *, started: bool = False) -> SessionConfig:
    return apply_session_update(config, session, started=started, max_prompt_chars=50, voices=lambda: VOICES)


def test_ga_and_beta_shapes_set_the_same_things():
    ga = update({"type": "realtime", "instructions": " Be brief. ", "audio": {
        "input": {"format": {"type": "audio/pcmu"}},
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "NATF2.pt"}}})
    beta = update({"instructions": "Be brief.", "voice": "NATF2.pt", "input_audio_format": "g711_ulaw",
                   "output_audio_format": "pcm16"})
    assert ga == beta == SessionConfig(instructions="Be brief.", voice="NATF2.pt", input_format=AudioFormat.PCMU,
                                       output_format=AudioFormat.PCM16)
    assert update({"input_audio_format": "g711_alaw"}).input_format is AudioFormat.PCMA
    assert update({"temperature": 0.6}).conversation().sampling.audio_temperature == 0.6


def test_unknown_fields_are_ignored():
    assert update({"tools": [{"type": "function"}], "turn_detection": None, "whatever": 1}) == SessionConfig()


@pytest.mark.parametrize("session, param", [
    ({"instructions": "x" * 51}, "session.instructions"),
    ({"instructions": 5}, "session.instructions"),
    ({"instructions": "a\x00b"}, "session.instructions"),
    ({"voice": "alloy"}, "session.voice"),
    ({"voice": "../NATF0.pt"}, "session.voice"),
    ({"audio": {"output": {"voice": "NOPE.pt"}}}, "session.audio.output.voice"),
    ({"input_audio_format": "opus"}, "session.input_audio_format"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "session.audio.input.format"),
    ({"audio": {"output": {"format": {"type": "audio/mp3"}}}}, "session.audio.output.format"),
    ({"temperature": "hot"}, "session.temperature"),
    ({"temperature": 99}, "session.temperature"),
])
def test_bad_values_are_errors_with_their_param(session, param):
    with pytest.raises(RealtimeError) as error:
        update(session)
    assert error.value.param == param and error.value.kind == "invalid_request_error"


def test_persona_voice_and_formats_are_fixed_once_started():
    config = update({"instructions": "A.", "voice": "NATF0.pt"})
    assert update({"instructions": "A.", "voice": "NATF0.pt"}, config, started=True) == config  # same: fine
    for session in ({"instructions": "B."}, {"voice": "NATF2.pt"}, {"input_audio_format": "g711_ulaw"},
                    {"temperature": 0.5}):
        with pytest.raises(RealtimeError) as error:
            update(session, config, started=True)
        assert error.value.code == "session_started"


# -- server events ------------------------------------------------------------------------------


def every_server_event(events: ServerEvents) -> list[str]:
    config = SessionConfig(instructions="Hi.", voice="NATF2.pt", input_format=AudioFormat.PCMU,
                           output_format=AudioFormat.PCMA)
    return [
        events.session_created(config), events.session_updated(SessionConfig()),
        events.error("bad", param="session.voice", event_id="e1"), events.error("down", kind="server_error"),
        events.committed("item_1", None), events.committed("item_2", "item_1"), events.cleared(),
        events.speech_started(120, "item_3"), events.speech_stopped(900, "item_3"),
        *events.response_started("resp_1", "item_4", config), events.output_cleared("resp_1"),
        events.audio_delta("resp_1", "item_4", b"\x00\xff"), events.transcript_delta("resp_1", "item_4", " hi"),
        *events.response_finished("resp_1", "item_4", config, " hi"),
        *events.response_finished("resp_2", "item_5", config, "", status="cancelled"),
    ]


@pytest.mark.parametrize("dialect", list(Dialect))
def test_every_server_event_is_valid_for_the_sdk(dialect):
    events = ServerEvents(dialect, model="tiny")
    messages = [json.loads(m) for m in every_server_event(events)]
    for message in messages:
        UNIONS[dialect].validate_python(message)
    ids = [m["event_id"] for m in messages]
    assert len(set(ids)) == len(ids)


def test_the_dialects_name_the_audio_events_their_way():
    names = {d: [json.loads(m)["type"] for m in every_server_event(ServerEvents(d, model="m"))] for d in Dialect}
    assert "response.output_audio.delta" in names[Dialect.GA] and "response.audio.delta" in names[Dialect.BETA]
    assert "response.output_audio_transcript.done" in names[Dialect.GA]
    assert "response.audio_transcript.done" in names[Dialect.BETA]
    assert not {n for n in names[Dialect.BETA] if "output_audio." in n or "output_audio_transcript" in n}


def test_the_session_object_says_what_was_set():
    config = SessionConfig(instructions="Hi.", voice="NATF2.pt", input_format=AudioFormat.PCMU)
    ga = ServerEvents(Dialect.GA, model="tiny").session(config)
    assert (ga["instructions"], ga["audio"]["output"]["voice"], ga["audio"]["input"]["format"], ga["model"]) == \
        ("Hi.", "NATF2.pt", {"type": "audio/pcmu"}, "tiny")
    beta = ServerEvents(Dialect.BETA, model="tiny").session(config)
    assert (beta["voice"], beta["input_audio_format"], beta["output_audio_format"]) == \
        ("NATF2.pt", "g711_ulaw", "pcm16")


def test_the_queue_event_is_ours():
    assert json.loads(ServerEvents(Dialect.GA, model="m").queued(3))["type"] == "pplex.queued"
