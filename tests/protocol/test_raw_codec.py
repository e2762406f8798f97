"""The raw PCM codec, without sockets."""

import json

import numpy as np
import pytest

from pplex_trio.protocol import CloseCode, ProtocolError, raw


def test_open_carries_its_settings():
    event = raw.parse_client_message('{"type": "open", "persona": "p", "voice": "NATF2.pt"}')
    assert event == raw.Open({"persona": "p", "voice": "NATF2.pt"})


def test_close():
    assert raw.parse_client_message('{"type":"close"}') == raw.Close()


def test_pcm_is_float32_little_endian():
    samples = np.array([0.0, 0.5, -1.25, 3e-7], dtype="<f4")
    event = raw.parse_client_message(samples.tobytes())
    assert isinstance(event, raw.PcmReceived)
    assert event.pcm.dtype == np.float32
    np.testing.assert_array_equal(event.pcm, samples)


@pytest.mark.parametrize("length", [1, 2, 3, 5, 4099])
def test_pcm_that_is_not_whole_samples_is_refused(length):
    with pytest.raises(ProtocolError) as info:
        raw.parse_client_message(b"\x00" * length)
    assert info.value.code == CloseCode.INVALID_PAYLOAD
    assert "multiple of 4" in info.value.message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_are_refused(bad):
    samples = np.array([0.1, bad, 0.2], dtype="<f4")
    with pytest.raises(ProtocolError) as info:
        raw.parse_client_message(samples.tobytes())
    assert info.value.code == CloseCode.INVALID_PAYLOAD
    assert "NaN" in info.value.message


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2]", '"open"', "null"])
def test_bad_json_is_invalid_payload(text):
    with pytest.raises(ProtocolError) as info:
        raw.parse_client_message(text)
    assert info.value.code == CloseCode.INVALID_PAYLOAD


@pytest.mark.parametrize("text", ['{"type": "dance"}', "{}", '{"type": 3}'])
def test_unknown_type_is_unsupported(text):
    with pytest.raises(ProtocolError) as info:
        raw.parse_client_message(text)
    assert info.value.code == CloseCode.UNSUPPORTED_DATA
    assert "open" in info.value.message


def test_server_messages():
    assert json.loads(raw.ready()) == {"type": "ready"}
    assert json.loads(raw.queued(3)) == {"type": "queued", "position": 3}
    assert json.loads(raw.text(" é")) == {"type": "text", "text": " é", "speaker": "agent"}
    assert json.loads(raw.text(" hi", raw.USER)) == {"type": "text", "text": " hi", "speaker": "user"}
    assert json.loads(raw.done()) == {"type": "done"}
    assert json.loads(raw.error("x")) == {"type": "error", "error": "x"}
    frame = np.linspace(-1, 1, 1920, dtype=np.float32)
    assert np.array_equal(np.frombuffer(raw.pcm_frame(frame), dtype="<f4"), frame)
