"""The Exotel voice streaming codec on its own: its events in, ours out (whole 320-byte chunks), the applet's URL."""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest

from pplex_trio.protocol import CloseCode, Encoding, ProtocolError, exotel, telephony

STREAM = "a8cdb7e0a1b5c3d2e4f6"
START = {
    "event": "start",
    "sequence_number": "1",
    "stream_sid": STREAM,
    "start": {
        "stream_sid": STREAM,
        "call_sid": "CA1",
        "account_sid": "AC1",
        "from": "+919876543210",
        "to": "+918047491899",
        "custom_parameters": {"persona": "Hello & <welcome>", "token": "t"},
        "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"},
    },
}


def started() -> exotel.ExotelCarrier:
    carrier = exotel.ExotelCarrier()
    carrier.parse(json.dumps(START))
    return carrier


def test_every_event_of_a_stream_is_parsed():
    carrier = exotel.ExotelCarrier()
    assert isinstance(carrier.parse('{"event": "connected"}'), telephony.CallConnected)
    start = carrier.parse(json.dumps(START))
    assert isinstance(start, telephony.CallStart)
    assert (start.stream_id, start.call_id, start.account_id) == (STREAM, "CA1", "AC1")
    assert start.parameters == {"persona": "Hello & <welcome>", "token": "t"}
    assert (start.audio_format.encoding, start.audio_format.rate) == (Encoding.PCM16, 8000)
    media = {
        "event": "media",
        "sequence_number": "2",
        "stream_sid": STREAM,
        "media": {"chunk": "1", "timestamp": "100", "payload": base64.b64encode(b"\x01\x00" * 800).decode()},
    }
    assert carrier.parse(json.dumps(media)) == telephony.CallAudio(b"\x01\x00" * 800)
    assert carrier.parse('{"event": "mark", "mark": {"name": "m1"}}') == telephony.CallMark("m1")
    assert carrier.parse('{"event": "dtmf", "dtmf": {"digit": "1", "duration": "100"}}') == telephony.CallDtmf("1")
    assert isinstance(carrier.parse('{"event": "stop", "stop": {"reason": "callended"}}'), telephony.CallStop)
    assert carrier.parse('{"event": "something.new"}') is None


@pytest.mark.parametrize("rate, expected", [("16000", 16000), (24000, 24000), ("8000", 8000)])
def test_the_wider_rates_are_taken(rate, expected):
    start = {**START, "start": {**START["start"], "media_format": {"encoding": "audio/x-raw", "sample_rate": rate}}}
    assert exotel.ExotelCarrier().parse(json.dumps(start)).audio_format.rate == expected


def test_the_stream_sid_may_be_outside_the_start_and_the_format_defaults_to_8_khz():
    parsed = exotel.ExotelCarrier().parse('{"event": "start", "stream_sid": "S2", "start": {}}')
    assert parsed.stream_id == "S2" and parsed.audio_format.rate == 8000 and parsed.parameters == {}


@pytest.mark.parametrize(
    "media_format",
    [
        {"encoding": "audio/x-raw", "sample_rate": "44100"},
        {"encoding": "audio/x-raw", "sample_rate": 8000.0},
        {"encoding": "audio/x-raw", "sample_rate": True},
        {"encoding": "audio/x-raw", "sample_rate": "fast"},
        {"encoding": "audio/x-mulaw", "sample_rate": "8000"},
    ],
)
def test_other_formats_are_refused_with_1003(media_format):
    with pytest.raises(ProtocolError) as refused:
        exotel.ExotelCarrier().parse(json.dumps({**START, "start": {**START["start"], "media_format": media_format}}))
    assert refused.value.code == CloseCode.UNSUPPORTED_DATA


@pytest.mark.parametrize(
    "message, code",
    [
        (b"\x00", CloseCode.UNSUPPORTED_DATA),
        ("{not json", CloseCode.INVALID_PAYLOAD),
        ('{"event": "media"}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "media", "media": {"payload": "not base64!"}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "media", "media": {"payload": "AAAA"}}', CloseCode.INVALID_PAYLOAD),  # 3 bytes: half a sample
        ('{"event": "start", "start": {}}', CloseCode.INVALID_PAYLOAD),  # no stream_sid
        ('{"event": "start", "start": {"stream_sid": "S", "media_format": "x"}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "start", "start": {"stream_sid": "S", "custom_parameters": {"a": 1}}}', CloseCode.INVALID_PAYLOAD),
        ('{"event": "mark", "mark": {}}', CloseCode.INVALID_PAYLOAD),
    ],
)
def test_a_malformed_event_is_a_protocol_error_with_its_close_code(message, code):
    with pytest.raises(ProtocolError) as refused:
        exotel.ExotelCarrier().parse(message)
    assert refused.value.code == code


def payload(message: str) -> bytes:
    return base64.b64decode(json.loads(message)["media"]["payload"])


def test_our_messages_name_the_stream():
    carrier = started()
    audio = bytes(range(256)) * 5  # 1280 bytes: four whole chunks
    assert json.loads(carrier.media(audio)) == {
        "event": "media",
        "stream_sid": STREAM,
        "media": {"payload": base64.b64encode(audio).decode()},
    }
    assert json.loads(carrier.mark("barge-in-1")) == {
        "event": "mark",
        "stream_sid": STREAM,
        "mark": {"name": "barge-in-1"},
    }
    assert json.loads(carrier.clear()) == {"event": "clear", "stream_sid": STREAM}


def test_our_audio_goes_out_in_whole_320_byte_chunks_and_the_rest_with_the_next():
    carrier = started()
    first, second = bytes([1]) * 1000, bytes([2]) * 280
    assert payload(carrier.media(first)) == first[:960]
    assert payload(carrier.media(second)) == first[960:] + second  # 40 + 280: one chunk
    assert len(payload(carrier.media(bytes(100)))) == 0  # less than a chunk: held
    carrier.clear()  # a clear drops what was held
    assert payload(carrier.media(bytes([3]) * 320)) == bytes([3]) * 320


def test_the_answer_is_the_applets_json_with_the_parameters_in_the_urls_query():
    tricky = 'Say "hi" & <smile>\'s\nnew line'
    answer = json.loads(
        exotel.answer_document("wss://example.com/telephony/exotel", {"persona": tricky, "token": "a&b"})
    )
    assert list(answer) == ["url"]
    url = urllib.parse.urlsplit(answer["url"])
    assert (url.scheme, url.netloc, url.path) == ("wss", "example.com", "/telephony/exotel")
    assert dict(urllib.parse.parse_qsl(url.query)) == {"persona": tricky, "token": "a&b"}
    assert json.loads(exotel.answer_document("wss://x/telephony/exotel", {})) == {"url": "wss://x/telephony/exotel"}
