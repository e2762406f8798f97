"""The Telnyx media streaming codec on its own: its events in, ours out, the TeXML answer."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET

import pytest

from pplex_trio.protocol import CloseCode, Encoding, ProtocolError, telephony, telnyx

STREAM = "32de0dea-53cb-4b21-89a4-9b3a7cfb6d41"
START = {
    "event": "start",
    "sequence_number": "1",
    "stream_id": STREAM,
    "start": {
        "user_id": "3fa85f64",
        "call_control_id": "v3:u5OAKGEPT3Dx8SZSSDRWEMdNH2OripQhO",
        "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
        "custom_parameters": {"persona": "Hello & <welcome>", "token": "t"},
        "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1},
    },
}


def started(start: dict = START) -> telnyx.TelnyxCarrier:
    carrier = telnyx.TelnyxCarrier()
    carrier.parse(json.dumps(start))
    return carrier


def test_every_event_of_a_stream_is_parsed():
    carrier = telnyx.TelnyxCarrier()
    assert isinstance(carrier.parse('{"event": "connected", "version": "1.0.0"}'), telephony.CallConnected)
    start = carrier.parse(json.dumps(START))
    assert isinstance(start, telephony.CallStart)
    assert (start.stream_id, start.call_id, start.account_id) == (
        STREAM,
        "v3:u5OAKGEPT3Dx8SZSSDRWEMdNH2OripQhO",
        "3fa85f64",
    )
    assert start.parameters == {"persona": "Hello & <welcome>", "token": "t"}
    assert (start.audio_format.encoding, start.audio_format.rate) == (Encoding.PCMU, 8000)
    assert start.reply_format is not None and start.reply_format.encoding is Encoding.PCMU  # the answer's codec
    media = {
        "event": "media",
        "sequence_number": "4",
        "stream_id": STREAM,
        "media": {
            "track": "inbound",
            "chunk": "2",
            "timestamp": "40",
            "payload": base64.b64encode(b"\xff" * 160).decode(),
        },
    }
    assert carrier.parse(json.dumps(media)) == telephony.CallAudio(b"\xff" * 160)
    inbound_track = {**media, "media": {**media["media"], "track": "inbound_track"}}
    assert carrier.parse(json.dumps(inbound_track)) == telephony.CallAudio(b"\xff" * 160)
    assert carrier.parse(json.dumps({**media, "media": {**media["media"], "track": "outbound"}})) is None
    assert carrier.parse('{"event": "mark", "stream_id": "s", "mark": {"name": "m1"}}') == telephony.CallMark("m1")
    assert carrier.parse('{"event": "dtmf", "dtmf": {"digit": "#"}}') == telephony.CallDtmf("#")
    assert isinstance(carrier.parse('{"event": "stop", "stop": {"call_control_id": "v3:x"}}'), telephony.CallStop)
    assert carrier.parse('{"event": "error", "payload": {"code": 100002, "title": "Unknown error"}}') is None
    assert carrier.parse('{"event": "something.new"}') is None


def test_the_stream_id_may_be_in_the_start_and_the_format_defaults_to_pcmu():
    start = {"event": "start", "start": {"stream_id": "S2", "call_control_id": "c"}}
    parsed = telnyx.TelnyxCarrier().parse(json.dumps(start))
    assert isinstance(parsed, telephony.CallStart)
    assert parsed.stream_id == "S2" and parsed.audio_format.encoding is Encoding.PCMU and parsed.parameters == {}


@pytest.mark.parametrize("encoding", ["PCMA", "audio/x-alaw"])
def test_alaw_calls_are_heard_in_alaw_and_answered_in_pcmu(encoding):
    alaw = {**START, "start": {**START["start"], "media_format": {"encoding": encoding, "sample_rate": 8000}}}
    start = telnyx.TelnyxCarrier().parse(json.dumps(alaw))
    assert start.audio_format.encoding is Encoding.PCMA and start.reply_format.encoding is Encoding.PCMU


@pytest.mark.parametrize(
    "media_format",
    [
        {"encoding": "L16", "sample_rate": 16000},
        {"encoding": "PCMU", "sample_rate": 16000},
        {"encoding": "PCMU", "sample_rate": 8000, "channels": 2},
        {"encoding": "OPUS", "sample_rate": 8000},
    ],
)
def test_other_formats_are_refused_with_1003(media_format):
    with pytest.raises(ProtocolError) as refused:
        telnyx.TelnyxCarrier().parse(json.dumps({**START, "start": {**START["start"], "media_format": media_format}}))
    assert refused.value.code == CloseCode.UNSUPPORTED_DATA and "8000" in refused.value.message


@pytest.mark.parametrize(
    "message, code",
    [
        (b"\x00", CloseCode.UNSUPPORTED_DATA),
        ("{not json", CloseCode.INVALID_PAYLOAD),
        ("[1]", CloseCode.INVALID_PAYLOAD),
        ('{"event": 5}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "media"}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "media", "media": {"payload": "not base64!"}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "start", "stream_id": "S", "start": {"custom_parameters": {"a": 1}}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "start", "start": {}}', CloseCode.INVALID_PAYLOAD),  # no stream_id anywhere
        ('{"event": "start", "stream_id": "S", "start": {"media_format": [1]}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "mark", "mark": {}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "dtmf", "dtmf": {"digit": 1}}', CloseCode.INVALID_PAYLOAD),
    ],
)
def test_a_malformed_event_is_a_protocol_error_with_its_close_code(message, code):
    with pytest.raises(ProtocolError) as refused:
        telnyx.TelnyxCarrier().parse(message)
    assert refused.value.code == code


def test_our_messages():
    carrier = started()
    assert json.loads(carrier.media(b"\x7f\x00")) == {
        "event": "media",
        "media": {"payload": base64.b64encode(b"\x7f\x00").decode()},
    }
    assert json.loads(carrier.mark("barge-in-1")) == {"event": "mark", "mark": {"name": "barge-in-1"}}
    assert json.loads(carrier.clear()) == {"event": "clear"}
    with pytest.raises(AssertionError):
        telnyx.TelnyxCarrier().clear()  # not before the start


def test_the_answer_document_is_texml_for_a_bidirectional_rtp_stream_with_escaped_parameters():
    tricky = 'Say "hi" & <smile>\'s\nnew line'
    document = telnyx.answer_document("wss://example.com/telephony/telnyx", {"persona": tricky, "token": "a&b"})
    assert document.startswith('<?xml version="1.0" encoding="UTF-8"?><Response>')
    stream = ET.fromstring(document).find("./Connect/Stream")
    assert stream is not None
    assert stream.get("url") == "wss://example.com/telephony/telnyx"
    assert (stream.get("bidirectionalMode"), stream.get("bidirectionalCodec")) == ("rtp", "PCMU")
    assert {p.get("name"): p.get("value") for p in stream.findall("Parameter")} == {"persona": tricky, "token": "a&b"}
    with pytest.raises(ProtocolError) as refused:
        telnyx.answer_document("wss://x/telephony/telnyx", {"voice": "bell\x07"})
    assert refused.value.param == "voice"
