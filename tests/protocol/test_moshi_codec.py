"""The Moshi codec, without sockets: every message kind both ways."""

import pytest

from pplex_trio.protocol import CloseCode, ProtocolError, moshi


def test_audio_message_carries_ogg_bytes():
    event = moshi.parse_client_message(b"\x01OggS-payload")
    assert event == moshi.AudioReceived(b"OggS-payload")


def test_audio_with_empty_payload_is_audio_of_nothing():
    assert moshi.parse_client_message(b"\x01") == moshi.AudioReceived(b"")


@pytest.mark.parametrize("kind", [0x00, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x42, 0xFF])
def test_every_other_kind_is_ignored_not_fatal(kind):
    event = moshi.parse_client_message(bytes([kind]) + b"\x01\x02")
    assert event == moshi.Ignored(kind)


def test_control_message_is_ignored():
    assert moshi.parse_client_message(b"\x03\x01") == moshi.Ignored(3)


def test_text_frame_is_unsupported_data():
    with pytest.raises(ProtocolError) as info:
        moshi.parse_client_message("hello")
    assert info.value.code == CloseCode.UNSUPPORTED_DATA
    assert "binary" in info.value.message


@pytest.mark.parametrize("empty", [b"", None])
def test_empty_frame_is_invalid_payload(empty):
    with pytest.raises(ProtocolError) as info:
        moshi.parse_client_message(empty)
    assert info.value.code == CloseCode.INVALID_PAYLOAD


def test_server_messages_have_the_official_layout():
    assert moshi.handshake() == b"\x00"
    assert moshi.audio(b"OggS") == b"\x01OggS"
    assert moshi.text(" héllo") == b"\x02" + " héllo".encode()
    assert moshi.error("bad") == b"\x05bad"
    assert moshi.ping() == b"\x06"


def test_server_audio_round_trips_through_the_client_parser():
    assert moshi.parse_client_message(moshi.audio(b"pages")) == moshi.AudioReceived(b"pages")


def test_0x12_is_the_clients_hangup_and_0x11_carries_the_resume_token_as_json():
    assert moshi.parse_client_message(b"\x12") == moshi.HangupReceived()
    assert moshi.hangup() == b"\x12"
    assert moshi.resume("tok") == b'\x11{"token":"tok"}'
    assert moshi.resume("tok", resumed=True, notice="né") == b'\x11{"token":"tok","resumed":true,"notice":"n\xc3\xa9"}'
