"""The answer a peer gives (``_peer.Peer.answer``), read with aiortc's SDP parser: Opus alone for the audio (the
one codec the call's audio path decodes), in-band FEC asked for."""

from __future__ import annotations

import pytest

pytest.importorskip("aiortc")

from aiortc.sdp import SessionDescription  # noqa: E402

from _helpers.aio import run_asyncio  # noqa: E402
from _helpers.webrtc import Caller  # noqa: E402
from pplex_trio.server.webrtc._peer import Peer  # noqa: E402


class Unheard:
    """Events nobody listens to (no call is made)."""

    def audio(self, pcm16: bytes) -> None: ...

    def message(self, text: str | bytes) -> None: ...

    def channel_open(self) -> None: ...

    def state(self, ice: str, dtls: str, connection: str) -> None: ...


def test_the_answer_takes_opus_alone_and_asks_for_its_in_band_fec():
    async def exchange() -> tuple[str, str]:
        caller, peer = Caller(), Peer(Unheard(), host="127.0.0.1")
        try:
            offer = await caller.offer()
            return offer, await peer.answer(offer)
        finally:
            await peer.close()
            await caller.pc.close()

    offer, answer = run_asyncio(exchange())
    offered = next(m for m in SessionDescription.parse(offer).media if m.kind == "audio")
    assert len(offered.rtp.codecs) > 1  # (aiortc offers PCMU, PCMA, G722 too)
    (audio,) = [m for m in SessionDescription.parse(answer).media if m.kind == "audio"]
    (opus,) = audio.rtp.codecs
    assert opus.mimeType.lower() == "audio/opus" and audio.fmt == [opus.payloadType]
    assert opus.payloadType == next(c.payloadType for c in offered.rtp.codecs if c.mimeType.lower() == "audio/opus")
    assert opus.parameters.get("useinbandfec") == 1
    assert f"a=fmtp:{opus.payloadType} " in answer and "useinbandfec=1" in answer
