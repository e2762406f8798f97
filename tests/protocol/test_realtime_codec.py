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

from pplex_trio.protocol import AudioAppend, ClientEvent, ProtocolError
from pplex_trio.protocol._realtime import (
    AudioFormat,
    Dialect,
    EventError,
    ItemEvent,
    ResponseCreate,
    SessionConfig,
    SessionUpdate,
    apply_session_update,
    parse_client_event,
)
from pplex_trio.protocol._realtime_events import ServerEvents
from pplex_trio.protocol._realtime_items import MAX_ITEMS, ConversationItems

openai_ga = pytest.importorskip("openai.types.realtime")
openai_beta = pytest.importorskip("openai.types.beta.realtime")
UNIONS = {
    Dialect.GA: TypeAdapter(openai_ga.RealtimeServerEvent),
    Dialect.BETA: TypeAdapter(openai_beta.RealtimeServerEvent),
}
VOICES = ["NATF0.pt", "NATF2.pt", "VARM1.pt"]


def parse(event: dict | str) -> ClientEvent:
    return parse_client_event(event if isinstance(event, str) else json.dumps(event))


# -- client events ------------------------------------------------------------------------


def test_every_supported_client_event_is_parsed():
    update = parse({"type": "session.update", "event_id": "e1", "session": {"instructions": "x"}})
    assert update == SessionUpdate("session.update", "e1", {"instructions": "x"})
    append = parse({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x02").decode()})
    assert append == AudioAppend("input_audio_buffer.append", None, b"\x01\x02")
    for kind in (
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "response.cancel",
        "output_audio_buffer.clear",
    ):
        assert parse({"type": kind, "event_id": 7}) == ClientEvent(kind, None)  # a non-string id is dropped
    assert parse({"type": "response.create"}) == ResponseCreate("response.create", None, None)
    create = {"type": "response.create", "response": {"metadata": {"client_event_id": "c1"}, "instructions": "x"}}
    assert parse(create) == ResponseCreate("response.create", None, {"client_event_id": "c1"})
    truncate = {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": 5}
    assert parse(truncate) == ItemEvent("conversation.item.truncate", None, truncate)


@pytest.mark.parametrize(
    "message, param, code",
    [
        ("not json", None, "invalid_json"),
        ("[1, 2]", "type", "invalid_event"),
        ('{"type": 5}', "type", "invalid_event"),
        ('{"type": "nonsense.event"}', "type", "invalid_event_type"),
        ('{"type": "response.create", "response": {"metadata": {"k": 5}}}', "response.metadata", "invalid_value"),
        ('{"type": "response.create", "response": {"metadata": []}}', "response.metadata", "invalid_value"),
        ('{"type": "input_audio_buffer.append", "audio": "***"}', "audio", "invalid_value"),
        ('{"type": "input_audio_buffer.append", "audio": "QUJ"}', "audio", "invalid_value"),  # bad padding
        ('{"type": "input_audio_buffer.append"}', "audio", "invalid_value"),
    ],
)
def test_bad_client_events_are_errors_that_name_the_field(message, param, code):
    with pytest.raises(EventError) as error:
        parse(message)
    assert (error.value.param, error.value.code) == (param, code)


def test_binary_messages_end_the_session():
    with pytest.raises(ProtocolError) as binary:
        parse_client_event(b"\x00")
    assert binary.value.code == 1003


# -- session updates --------------------------------------------------------------------------


def update(session: dict, config: SessionConfig = SessionConfig(), *, started: bool = False) -> SessionConfig:
    updated, voice_error = apply_session_update(
        config, session, started=started, max_prompt_chars=50, voices=lambda: VOICES
    )
    if voice_error is not None:
        raise voice_error
    return updated


def test_ga_and_beta_shapes_set_the_same_things():
    ga = update(
        {
            "type": "realtime",
            "instructions": " Be brief. ",
            "audio": {
                "input": {"format": {"type": "audio/pcmu"}},
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "NATF2.pt"},
            },
        }
    )
    beta = update(
        {
            "instructions": "Be brief.",
            "voice": "NATF2.pt",
            "input_audio_format": "g711_ulaw",
            "output_audio_format": "pcm16",
        }
    )
    assert (
        ga
        == beta
        == SessionConfig(
            instructions="Be brief.", voice="NATF2.pt", input_format=AudioFormat.PCMU, output_format=AudioFormat.PCM16
        )
    )
    assert update({"input_audio_format": "g711_alaw"}).input_format is AudioFormat.PCMA
    assert update({"temperature": 0.6}).conversation().sampling.audio_temperature == 0.6


def test_unknown_fields_are_ignored():
    assert update({"tools": [{"type": "function"}], "turn_detection": None, "whatever": 1}) == SessionConfig()


@pytest.mark.parametrize(
    "session, param",
    [
        ({"instructions": "x" * 51}, "session.instructions"),
        ({"instructions": 5}, "session.instructions"),
        ({"instructions": "a\x00b"}, "session.instructions"),
        ({"voice": "allo"}, "session.voice"),
        ({"voice": "../NATF0.pt"}, "session.voice"),
        ({"audio": {"output": {"voice": "NOPE.pt"}}}, "session.audio.output.voice"),
        ({"input_audio_format": "opus"}, "session.input_audio_format"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "session.audio.input.format"),
        ({"audio": {"output": {"format": {"type": "audio/mp3"}}}}, "session.audio.output.format"),
        ({"temperature": "hot"}, "session.temperature"),
        ({"temperature": 99}, "session.temperature"),
        ({"input_audio_transcription": 5}, "session.input_audio_transcription"),
        ({"audio": {"input": {"transcription": "yes"}}}, "session.audio.input.transcription"),
    ],
)
def test_bad_values_are_errors_with_their_param(session, param):
    with pytest.raises(EventError) as error:
        update(session)
    assert error.value.param == param and error.value.kind == "invalid_request_error"


def test_openai_voice_names_stand_for_model_voices():
    assert update({"voice": "marin"}).voice == "NATF2.pt"  # LiveKit's default
    assert update({"audio": {"output": {"voice": " Alloy "}}}).voice == "NATF0.pt"
    assert update({"voice": "cedar"}).voice is None  # NATM2.pt is not among VOICES: the engine's default voice
    assert update({"voice": "VARM1.pt"}).voice == "VARM1.pt"  # the model's own names as before


def test_an_unknown_voice_is_reported_and_the_rest_applied():
    config, error = apply_session_update(
        SessionConfig(),
        {"voice": "nova2", "instructions": "Be kind.", "output_audio_format": "g711_alaw"},
        started=False,
        max_prompt_chars=50,
        voices=lambda: VOICES,
        event_id="e9",
    )
    assert config == SessionConfig(instructions="Be kind.", output_format=AudioFormat.PCMA)
    assert (error.param, error.event_id) == ("session.voice", "e9") and "'nova2'" in error.message
    assert "marin" in error.message  # the names that work are said


def test_once_started_a_new_persona_is_taken_and_the_formats_are_fixed():
    config = update({"instructions": "A.", "voice": "NATF0.pt"})
    assert update({"instructions": "A.", "voice": "NATF0.pt"}, config, started=True) == config  # same: fine
    changed = update({"instructions": "B.", "voice": "NATF2.pt", "temperature": 0.5}, config, started=True)
    assert (changed.instructions, changed.voice, changed.temperature) == ("B.", "NATF2.pt", 0.5)  # (the prompt reruns)
    for session in ({"input_audio_format": "g711_ulaw"}, {"audio": {"output": {"format": {"type": "audio/pcma"}}}}):
        with pytest.raises(EventError) as error:
            update(session, config, started=True)
        assert error.value.code == "session_started"


# -- server events ------------------------------------------------------------------------------


def every_server_event(events: ServerEvents) -> list[str]:
    config = SessionConfig(
        instructions="Hi.", voice="NATF2.pt", input_format=AudioFormat.PCMU, output_format=AudioFormat.PCMA
    )
    return [
        events.session_created(config),
        events.session_updated(SessionConfig()),
        events.error("bad", param="session.voice", event_id="e1"),
        events.error("down", kind="server_error"),
        events.committed("item_1", None),
        events.committed("item_2", "item_1"),
        events.cleared(),
        events.speech_started(120, "item_3"),
        events.speech_stopped(900, "item_3"),
        *events.response_started("resp_1", "item_4", config),
        events.output_cleared("resp_1"),
        events.audio_delta("resp_1", "item_4", b"\x00\xff"),
        events.transcript_delta("resp_1", "item_4", " hi"),
        *events.response_finished("resp_1", "item_4", config, " hi"),
        *events.response_finished("resp_2", "item_5", config, "", status="cancelled"),
        *events.response_started("resp_3", "item_6", config, {"client_event_id": "c1"}),
        *events.response_finished("resp_3", "item_6", config, "", metadata={"client_event_id": "c1"}),
        *events.item_added(None, USER_TEXT),
        *events.item_added("item_6", USER_TEXT),
        events.item_truncated("item_6", 0, 1500),
        events.item_deleted("item_7"),
        events.item_retrieved(USER_TEXT),
        events.item_retrieved(events.item("item_6", "completed", " hi")),
    ]


USER_TEXT = {
    "id": "item_7",
    "object": "realtime.item",
    "type": "message",
    "role": "user",
    "status": "completed",
    "content": [{"type": "input_text", "text": "Greet the caller."}],
}


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
    assert (ga["instructions"], ga["audio"]["output"]["voice"], ga["audio"]["input"]["format"], ga["model"]) == (
        "Hi.",
        "NATF2.pt",
        {"type": "audio/pcmu"},
        "tiny",
    )
    beta = ServerEvents(Dialect.BETA, model="tiny").session(config)
    assert (beta["voice"], beta["input_audio_format"], beta["output_audio_format"]) == (
        "NATF2.pt",
        "g711_ulaw",
        "pcm16",
    )


def test_the_queue_event_is_ours():
    assert json.loads(ServerEvents(Dialect.GA, model="m").queued(3))["type"] == "pplex.queued"


@pytest.mark.parametrize("dialect", list(Dialect))
def test_response_metadata_is_echoed(dialect):
    events = ServerEvents(dialect, model="m")
    created = json.loads(events.response_started("r", "i", SessionConfig(), {"client_event_id": "c7"})[0])
    done = json.loads(events.response_finished("r", "i", SessionConfig(), "", metadata={"client_event_id": "c7"})[-1])
    assert created["type"] == "response.created" and created["response"]["metadata"] == {"client_event_id": "c7"}
    assert done["type"] == "response.done" and done["response"]["metadata"] == {"client_event_id": "c7"}


def test_item_events_are_named_per_dialect():
    ga = [json.loads(m)["type"] for m in ServerEvents(Dialect.GA, model="m").item_added(None, USER_TEXT)]
    beta = [json.loads(m)["type"] for m in ServerEvents(Dialect.BETA, model="m").item_added(None, USER_TEXT)]
    assert ga == ["conversation.item.added", "conversation.item.done"] and beta == ["conversation.item.created"]


# -- conversation items ----------------------------------------------------------------------


def new_items() -> ConversationItems:
    counter = iter(range(1, 10_000))
    return ConversationItems(lambda prefix: f"{prefix}_{next(counter)}")


def test_items_are_kept_named_and_chained():
    items = new_items()
    assert items.create({"item": {"type": "message", "role": "system", "content": []}}, None)[0] is None
    previous, kept = items.create({"item": {"id": "mine", "type": "message", "role": "user", "content": []}}, None)
    assert previous == "item_1" and kept["id"] == "mine" and kept["status"] == "completed"
    assert items.retrieve({"item_id": "item_1"}, None)["role"] == "system"
    assert items.truncate({"item_id": "mine", "content_index": 0, "audio_end_ms": 640}, None) == ("mine", 0, 640)
    assert items.delete({"item_id": "item_1"}, None) == "item_1" and items.last_id == "mine"


@pytest.mark.parametrize(
    "event, param, code",
    [
        ({"item": "text"}, "item", "invalid_value"),
        ({"item": {"type": "image"}}, "item.type", "invalid_value"),
        ({"item": {"type": "message", "role": "robot"}}, "item.role", "invalid_value"),
        ({"item": {"type": "message", "role": "user", "id": 5}}, "item.id", "invalid_value"),
        ({"item": {"type": "message", "role": "user", "id": "x" * 65}}, "item.id", "invalid_value"),
    ],
)
def test_bad_items_are_refused_by_field(event, param, code):
    with pytest.raises(EventError) as error:
        new_items().create(event, "e1")
    assert (error.value.param, error.value.code, error.value.event_id) == (param, code, "e1")


def test_unknown_item_ids_and_bad_offsets_are_refused():
    items = new_items()
    items.create({"item": {"id": "a", "type": "message", "role": "user"}}, None)
    with pytest.raises(EventError) as twice:
        items.create({"item": {"id": "a", "type": "message", "role": "user"}}, None)
    assert twice.value.code == "item_already_exists"
    for bad in ({"item_id": "zzz", "audio_end_ms": 0}, {"item_id": 3}):
        with pytest.raises(EventError) as missing:
            items.truncate(bad, None)
        assert missing.value.param == "item_id"
    for bad in (
        {"audio_end_ms": -1},
        {"audio_end_ms": 1.5},
        {"audio_end_ms": True},
        {"content_index": -2, "audio_end_ms": 0},
    ):
        with pytest.raises(EventError):
            items.truncate({"item_id": "a", **bad}, None)


def test_only_the_last_items_are_kept():
    items = new_items()
    for _ in range(MAX_ITEMS + 5):
        items.create({"item": {"type": "message", "role": "user"}}, None)
    with pytest.raises(EventError):
        items.retrieve({"item_id": "item_5"}, None)  # forgotten
    assert items.retrieve({"item_id": "item_6"}, None)["id"] == "item_6"
