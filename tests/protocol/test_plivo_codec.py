"""The Plivo audio streams codec on its own: its events in, ours out, the Plivo XML answer."""

from __future__ import annotations

import base64
import json
import urllib.parse
import xml.etree.ElementTree as ET

import pytest

from pplex_trio.protocol import CloseCode, Encoding, ProtocolError, plivo, telephony

STREAM = "20170ada-f610-433b-8758-c02a2aab3662"
START = {
    "event": "start",
    "sequenceNumber": 0,
    "start": {
        "callId": "CA1",
        "streamId": STREAM,
        "accountId": "MA1",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000},
    },
    "extra_headers": '{"persona": "Hello & <welcome>", "token": "t"}',
}


def started(start: dict = START) -> plivo.PlivoCarrier:
    carrier = plivo.PlivoCarrier()
    carrier.parse(json.dumps(start))
    return carrier


def test_every_event_of_a_stream_is_parsed():
    carrier = plivo.PlivoCarrier()
    start = carrier.parse(json.dumps(START))
    assert isinstance(start, telephony.CallStart)
    assert (start.stream_id, start.call_id, start.account_id) == (STREAM, "CA1", "MA1")
    assert start.parameters == {"persona": "Hello & <welcome>", "token": "t"}
    assert (start.audio_format.encoding, start.audio_format.rate) == (Encoding.PCMU, 8000)
    media = {
        "event": "media",
        "sequenceNumber": 3,
        "streamId": STREAM,
        "media": {
            "track": "inbound",
            "timestamp": "60",
            "chunk": 3,
            "payload": base64.b64encode(b"\xff" * 160).decode(),
        },
    }
    assert carrier.parse(json.dumps(media)) == telephony.CallAudio(b"\xff" * 160)
    assert carrier.parse(json.dumps({**media, "media": {**media["media"], "track": "outbound"}})) is None
    assert carrier.parse(json.dumps({"event": "playedStream", "streamId": STREAM, "name": "m1"})) == telephony.CallMark(
        "m1"
    )
    assert carrier.parse('{"event": "clearedAudio", "streamId": "s"}') is None
    assert carrier.parse('{"event": "dtmf", "dtmf": {"track": "inbound", "digit": "5"}}') == telephony.CallDtmf("5")
    assert isinstance(carrier.parse('{"event": "stop", "streamId": "s"}'), telephony.CallStop)
    assert carrier.parse('{"event": "something.new"}') is None


@pytest.mark.parametrize(
    "headers, parameters",
    [
        ('{"persona": "a, b=c"}', {"persona": "a, b=c"}),  # a JSON object's text
        ({"voice": "NATF0.pt"}, {"voice": "NATF0.pt"}),  # an object
        ("persona=Hi,voice=NATF0.pt", {"persona": "Hi", "voice": "NATF0.pt"}),  # Plivo's k=v,k=v
        ("", {}),
        (None, {}),
    ],
)
def test_the_extra_headers_are_read_in_each_of_their_shapes(headers, parameters):
    start = {**START, "extra_headers": headers}
    assert plivo.PlivoCarrier().parse(json.dumps(start)).parameters == parameters


def test_the_extra_headers_may_be_in_the_start():
    start = {"event": "start", "start": {**START["start"], "extraHeaders": "token=t"}}
    assert plivo.PlivoCarrier().parse(json.dumps(start)).parameters == {"token": "t"}


@pytest.mark.parametrize("rate", [8000, 16000])
def test_linear_pcm_streams_are_taken_and_answered_in_their_format(rate):
    start = {**START, "start": {**START["start"], "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": rate}}}
    carrier = plivo.PlivoCarrier()
    parsed = carrier.parse(json.dumps(start))
    assert (parsed.audio_format.encoding, parsed.audio_format.rate) == (Encoding.PCM16, rate)
    even = {"event": "media", "media": {"payload": base64.b64encode(b"\x01\x00" * 3).decode()}}
    assert carrier.parse(json.dumps(even)) == telephony.CallAudio(b"\x01\x00" * 3)
    odd = {"event": "media", "media": {"payload": base64.b64encode(b"\x01\x00\x02").decode()}}
    with pytest.raises(ProtocolError) as refused:
        carrier.parse(json.dumps(odd))
    assert refused.value.code == CloseCode.INVALID_PAYLOAD
    assert json.loads(carrier.media(b"\x01\x00"))["media"] == {
        "contentType": "audio/x-l16",
        "sampleRate": rate,
        "payload": base64.b64encode(b"\x01\x00").decode(),
    }


@pytest.mark.parametrize(
    "media_format",
    [
        {"encoding": "audio/x-mulaw", "sampleRate": 16000},
        {"encoding": "audio/x-l16", "sampleRate": 24000},
        {"encoding": "audio/x-l16", "sampleRate": 8000.0},
        {"encoding": "audio/x-l16", "sampleRate": "8000"},
        {"encoding": "audio/x-alaw", "sampleRate": 8000},
    ],
)
def test_other_formats_are_refused_with_1003(media_format):
    with pytest.raises(ProtocolError) as refused:
        plivo.PlivoCarrier().parse(json.dumps({**START, "start": {**START["start"], "mediaFormat": media_format}}))
    assert refused.value.code == CloseCode.UNSUPPORTED_DATA


@pytest.mark.parametrize(
    "message, code",
    [
        (b"\x00", CloseCode.UNSUPPORTED_DATA),
        ("{not json", CloseCode.INVALID_PAYLOAD),
        ('{"event": "media", "media": {"payload": "not base64!"}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "start", "start": {}}', CloseCode.INVALID_PAYLOAD),  # no streamId
        ('{"event": "start", "start": {"streamId": "S", "mediaFormat": 5}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "start", "start": {"streamId": "S"}, "extra_headers": {"a": 1}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "start", "start": {"streamId": "S"}, "extra_headers": "[1]"}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "playedStream"}', CloseCode.INVALID_PAYLOAD),
    ],
)
def test_a_malformed_event_is_a_protocol_error_with_its_close_code(message, code):
    with pytest.raises(ProtocolError) as refused:
        plivo.PlivoCarrier().parse(message)
    assert refused.value.code == code


def test_our_messages_name_the_stream():
    carrier = started()
    assert json.loads(carrier.media(b"\x7f\x00")) == {
        "event": "playAudio",
        "streamId": STREAM,
        "media": {
            "contentType": "audio/x-mulaw",
            "sampleRate": 8000,
            "payload": base64.b64encode(b"\x7f\x00").decode(),
        },
    }
    assert json.loads(carrier.mark("barge-in-1")) == {"event": "checkpoint", "streamId": STREAM, "name": "barge-in-1"}
    assert json.loads(carrier.clear()) == {"event": "clearAudio", "streamId": STREAM}


def test_the_answer_document_is_plivo_xml_with_the_parameters_in_the_stream_urls_query():
    tricky = 'Say "hi" & <smile>\'s, a=b\nnew line'
    document = plivo.answer_document("wss://example.com/telephony/plivo", {"persona": tricky, "token": "a&b"})
    assert document.startswith('<?xml version="1.0" encoding="UTF-8"?><Response>')
    stream = ET.fromstring(document).find("./Stream")
    assert stream is not None and stream.text is not None
    assert (stream.get("bidirectional"), stream.get("keepCallAlive"), stream.get("contentType")) == (
        "true",
        "true",
        "audio/x-mulaw;rate=8000",
    )
    url = urllib.parse.urlsplit(stream.text)
    assert (url.scheme, url.netloc, url.path) == ("wss", "example.com", "/telephony/plivo")
    assert dict(urllib.parse.parse_qsl(url.query)) == {"persona": tricky, "token": "a&b"}
    bare = ET.fromstring(plivo.answer_document("wss://x/telephony/plivo", {})).find("./Stream")
    assert bare is not None and bare.text == "wss://x/telephony/plivo"  # no empty query
