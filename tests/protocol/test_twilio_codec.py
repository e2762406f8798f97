"""The Twilio Media Streams codec on its own: its events in, ours out, the TwiML answer, the signature."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import xml.etree.ElementTree as ET

import pytest

from pplex_trio.protocol import CloseCode, Encoding, ProtocolError, telephony, twilio

STREAM = "MZ18ad3ab5a668481ce02b83e7395059f0"
START = {
    "event": "start",
    "sequenceNumber": "1",
    "streamSid": STREAM,
    "start": {
        "accountSid": "AC123",
        "streamSid": STREAM,
        "callSid": "CA123",
        "tracks": ["inbound"],
        "customParameters": {"persona": "Hello & <welcome>", "token": "t"},
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    },
}


def started() -> twilio.TwilioCarrier:
    carrier = twilio.TwilioCarrier()
    carrier.parse(json.dumps(START))
    return carrier


def test_every_event_of_a_stream_is_parsed():
    carrier = twilio.TwilioCarrier()
    assert isinstance(
        carrier.parse('{"event": "connected", "protocol": "Call", "version": "1.0.0"}'), telephony.CallConnected
    )
    start = carrier.parse(json.dumps(START))
    assert isinstance(start, telephony.CallStart)
    assert (start.stream_id, start.call_id, start.account_id) == (STREAM, "CA123", "AC123")
    assert start.parameters == {"persona": "Hello & <welcome>", "token": "t"}
    assert (start.audio_format.encoding, start.audio_format.rate) == (Encoding.PCMU, 8000)
    media = {
        "event": "media",
        "streamSid": STREAM,
        "media": {
            "track": "inbound",
            "chunk": "2",
            "timestamp": "20",
            "payload": base64.b64encode(b"\xff" * 160).decode(),
        },
    }
    assert carrier.parse(json.dumps(media)) == telephony.CallAudio(b"\xff" * 160)
    assert carrier.parse(json.dumps({**media, "media": {**media["media"], "track": "outbound"}})) is None
    assert carrier.parse('{"event": "mark", "mark": {"name": "m1"}}') == telephony.CallMark("m1")
    assert carrier.parse('{"event": "dtmf", "dtmf": {"track": "inbound_track", "digit": "#"}}') == telephony.CallDtmf(
        "#"
    )
    assert isinstance(carrier.parse('{"event": "stop", "stop": {"callSid": "CA123"}}'), telephony.CallStop)
    assert carrier.parse('{"event": "something.new"}') is None  # an event Twilio may add later


def test_alaw_is_taken_where_the_stream_says_so_and_other_formats_are_refused():
    alaw = {**START, "start": {**START["start"], "mediaFormat": {"encoding": "audio/x-alaw", "sampleRate": 8000}}}
    assert twilio.TwilioCarrier().parse(json.dumps(alaw)).audio_format.encoding is Encoding.PCMA
    wide = {**START, "start": {**START["start"], "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 16000}}}
    with pytest.raises(ProtocolError) as refused:
        twilio.TwilioCarrier().parse(json.dumps(wide))
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
        ('{"event": "media", "media": {"payload": 5}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "start", "start": {"streamSid": "MZ", "customParameters": {"a": 1}}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "start", "start": {}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "mark", "mark": {}}', CloseCode.INVALID_PAYLOAD),
    ],
)
def test_a_malformed_event_is_a_protocol_error_with_its_close_code(message, code):
    with pytest.raises(ProtocolError) as refused:
        twilio.TwilioCarrier().parse(message)
    assert refused.value.code == code


def test_our_messages_name_the_stream():
    carrier = started()
    assert json.loads(carrier.media(b"\x7f\x00")) == {
        "event": "media",
        "streamSid": STREAM,
        "media": {"payload": base64.b64encode(b"\x7f\x00").decode()},
    }
    assert json.loads(carrier.mark("barge-in-1")) == {
        "event": "mark",
        "streamSid": STREAM,
        "mark": {"name": "barge-in-1"},
    }
    assert json.loads(carrier.clear()) == {"event": "clear", "streamSid": STREAM}


def test_the_answer_document_is_twiml_with_escaped_parameters():
    tricky = 'Say "hi" & <smile>\'s\nnew line'
    document = twilio.answer_document("wss://example.com/telephony/twilio", {"persona": tricky, "token": "a&b"})
    assert document.startswith('<?xml version="1.0" encoding="UTF-8"?><Response>')
    root = ET.fromstring(document)
    stream = root.find("./Connect/Stream")
    assert root.tag == "Response" and stream is not None
    assert stream.get("url") == "wss://example.com/telephony/twilio"
    assert {p.get("name"): p.get("value") for p in stream.findall("Parameter")} == {"persona": tricky, "token": "a&b"}
    with pytest.raises(ProtocolError) as refused:
        twilio.answer_document("wss://x/telephony/twilio", {"persona": "bell\x07"})
    assert refused.value.param == "persona"


def test_the_signature_is_twilios_hmac_sha1_over_the_url_and_the_sorted_form():
    token, url = "12345", "https://example.com/telephony/twilio/answer?token=t&persona=Hi"
    form = [("To", "+18005551212"), ("CallSid", "CA1234567890ABCDE"), ("From", "+14158675310"), ("Digits", "1234")]
    # Twilio's documented recipe, written out by hand: the URL, then each name and value, by name.
    data = url + "CallSidCA1234567890ABCDE" + "Digits1234" + "From+14158675310" + "To+18005551212"
    expected = base64.b64encode(hmac.new(token.encode(), data.encode(), hashlib.sha1).digest()).decode()
    assert twilio.signature(token, url, form) == expected
    assert twilio.signature_matches(expected, token, url, form)
    assert not twilio.signature_matches(expected, token, url + "&x=1", form)
    assert not twilio.signature_matches(expected, "other", url, form)
    assert not twilio.signature_matches(None, token, url, form)
    no_form = base64.b64encode(hmac.new(token.encode(), url.encode(), hashlib.sha1).digest()).decode()
    assert twilio.signature_matches(no_form, token, url)  # a WebSocket upgrade: the URL alone
