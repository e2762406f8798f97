"""A WebRTC call's SDP offer (issue 49 §6): what the call takes from a real offer, and the 400 a bad one is told.

The Chromium-style offer below is written here from the SDP grammar (RFC 8866, JSEP's offer shape), as a browser
sends one: audio with Opus and its rivals, a video line, a data channel. The aiortc offer is made by aiortc's own
``RTCPeerConnection`` in the test.
"""

from __future__ import annotations

import asyncio

import pytest

from pplex_trio.protocol import MAX_OFFER_BYTES, EventError, check_offer

FINGERPRINT = "sha-256 " + ":".join(f"{i:02X}" for i in range(32))


def chromium_offer(*, audio_codecs: str | None = None, audio_port: int = 9, data: bool = True) -> str:
    """An offer shaped as Chromium's: BUNDLE over three sections, ICE and DTLS on each, Opus as payload 111."""
    audio_rtpmaps = audio_codecs or (
        "a=rtpmap:111 opus/48000/2\r\n"
        "a=rtcp-fb:111 transport-cc\r\n"
        "a=fmtp:111 minptime=10;useinbandfec=1\r\n"
        "a=rtpmap:63 red/48000/2\r\n"
        "a=fmtp:63 111/111\r\n"
        "a=rtpmap:9 G722/8000\r\n"
        "a=rtpmap:0 PCMU/8000\r\n"
        "a=rtpmap:8 PCMA/8000\r\n"
        "a=rtpmap:13 CN/8000\r\n"
        "a=rtpmap:110 telephone-event/48000\r\n"
        "a=rtpmap:126 telephone-event/8000\r\n"
    )
    payloads = " ".join(
        line.split(":", 1)[1].split()[0] for line in audio_rtpmaps.split("\r\n") if line.startswith("a=rtpmap:")
    )
    ice = (
        "c=IN IP4 0.0.0.0\r\n"
        "a=rtcp:9 IN IP4 0.0.0.0\r\n"
        "a=ice-ufrag:Kq3v\r\n"
        "a=ice-pwd:u1Xb7nQ2ZsP0cR8dWe4mTt9y\r\n"
        "a=ice-options:trickle\r\n"
        f"a=fingerprint:{FINGERPRINT}\r\n"
        "a=setup:actpass\r\n"
    )
    text = (
        "v=0\r\n"
        "o=- 4611731400430051336 2 IN IP4 127.0.0.1\r\n"
        "s=-\r\n"
        "t=0 0\r\n"
        f"a=group:BUNDLE 0 1{' 2' if data else ''}\r\n"
        "a=extmap-allow-mixed\r\n"
        "a=msid-semantic: WMS stream\r\n"
        f"m=audio {audio_port} UDP/TLS/RTP/SAVPF {payloads}\r\n" + ice + "a=mid:0\r\n"
        "a=extmap:1 urn:ietf:params:rtp-hdrext:ssrc-audio-level\r\n"
        "a=sendrecv\r\n"
        "a=msid:stream track-audio\r\n"
        "a=rtcp-mux\r\n" + audio_rtpmaps + "a=ssrc:1001 cname:abcdEFGH\r\n"
        "m=video 9 UDP/TLS/RTP/SAVPF 96 97\r\n" + ice + "a=mid:1\r\n"
        "a=recvonly\r\n"
        "a=rtcp-mux\r\n"
        "a=rtpmap:96 VP8/90000\r\n"
        "a=rtpmap:97 rtx/90000\r\n"
        "a=fmtp:97 apt=96\r\n"
    )
    if data:
        text += "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n" + ice + "a=mid:2\r\na=sctp-port:5000\r\n"
    return text


def refusal(body) -> EventError:
    with pytest.raises(EventError) as caught:
        check_offer(body)
    assert caught.value.param == "sdp"
    assert caught.value.kind == "invalid_request_error"
    return caught.value


def test_a_chromium_offer_gives_its_opus_line_and_its_data_channel():
    offer = check_offer(chromium_offer())
    assert offer.audio.mid == "0"
    assert offer.audio.payload_type == 111
    assert offer.audio.fmtp == {"minptime": "10", "useinbandfec": "1"}
    assert offer.audio.inband_fec
    assert offer.audio.direction == "sendrecv"
    assert offer.data_channel and offer.data_mid == "2"


def test_an_offer_without_a_data_channel_is_taken_and_says_so():
    offer = check_offer(chromium_offer(data=False).encode())
    assert not offer.data_channel and offer.data_mid is None
    assert offer.audio.payload_type == 111


def test_the_older_sctpmap_data_channel_form_counts():
    text = chromium_offer(data=False) + (
        "m=application 9 DTLS/SCTP 5000\r\nc=IN IP4 0.0.0.0\r\na=mid:data\r\na=sctpmap:5000 webrtc-datachannel 1024\r\n"
    )
    offer = check_offer(text)
    assert offer.data_channel and offer.data_mid == "data"


def test_opus_under_another_payload_type_and_in_capitals_is_found():
    offer = check_offer(chromium_offer(audio_codecs="a=rtpmap:0 PCMU/8000\r\na=rtpmap:96 OPUS/48000/2\r\n"))
    assert offer.audio.payload_type == 96
    assert not offer.audio.inband_fec


@pytest.mark.parametrize(
    "body",
    [b"", b"hello", b'{"sdp": "v=0"}', "v=1\r\ns=-\r\n", "v=0\r\nnot a line\r\n", b"v=0\r\n\xff\xfe=\r\n"],
    ids=["empty", "words", "json", "version 1", "no type", "not utf-8"],
)
def test_what_is_not_sdp_is_refused(body):
    assert "not" in refusal(body).message


def test_an_offer_with_no_audio_m_line_is_refused():
    video_only = chromium_offer().split("m=audio")[0] + "m=video" + chromium_offer().split("m=video")[1]
    assert "no audio m-line" in refusal(video_only).message
    # a data channel alone (the first thing a page might send) is no call either
    data_only = chromium_offer().split("m=audio")[0] + "m=application" + chromium_offer().split("m=application")[1]
    assert "no audio m-line" in refusal(data_only).message


def test_an_audio_line_turned_down_is_no_audio():
    assert "no audio m-line" in refusal(chromium_offer(audio_port=0)).message


def test_audio_without_opus_is_refused_naming_what_was_offered():
    error = refusal(chromium_offer(audio_codecs="a=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"))
    assert "no Opus 48000/2" in error.message
    assert "PCMU/8000" in error.message and "PCMA/8000" in error.message


def test_opus_at_another_rate_or_mono_is_not_opus_48000_2():
    assert "no Opus" in refusal(chromium_offer(audio_codecs="a=rtpmap:111 opus/16000/1\r\n")).message


def test_an_inactive_audio_line_is_refused():
    assert "inactive" in refusal(chromium_offer().replace("a=sendrecv", "a=inactive")).message


def test_an_offer_without_ice_or_dtls_is_not_a_webrtc_offer():
    no_fingerprint = "\r\n".join(
        line for line in chromium_offer().split("\r\n") if not line.startswith("a=fingerprint")
    )
    assert "a=fingerprint" in refusal(no_fingerprint).message


def test_an_offer_past_the_cap_is_refused_before_it_is_read():
    padding = "a=x-padding:" + "p" * 100 + "\r\n"
    big = chromium_offer() + padding * (MAX_OFFER_BYTES // len(padding) + 1)
    error = refusal(big)
    assert error.code == "string_above_max_length"
    assert str(MAX_OFFER_BYTES) in error.message
    # the same offer under a larger cap is read (the cap is the only thing wrong with it)
    assert check_offer(big, max_bytes=2 * MAX_OFFER_BYTES).audio.payload_type == 111


def test_an_offer_made_by_aiortc_is_taken():
    aiortc = pytest.importorskip("aiortc")

    async def make_offer() -> str:
        peer = aiortc.RTCPeerConnection()
        try:
            peer.addTransceiver("audio")
            peer.createDataChannel("oai-events")
            await peer.setLocalDescription(await peer.createOffer())
            return peer.localDescription.sdp
        finally:
            await peer.close()

    text = asyncio.run(make_offer())
    offer = check_offer(text)
    # computed from aiortc's own reading of its offer
    parsed = aiortc.sdp.SessionDescription.parse(text)
    audio = next(media for media in parsed.media if media.kind == "audio")
    opus = next(codec for codec in audio.rtp.codecs if codec.mimeType.lower() == "audio/opus")
    assert offer.audio.payload_type == opus.payloadType
    assert offer.audio.mid == audio.rtp.muxId
    assert offer.data_channel
    assert offer.data_mid == next(media for media in parsed.media if media.kind == "application").rtp.muxId
