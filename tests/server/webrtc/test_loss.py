"""WebRTC calls over a lossy, jittery network (``_helpers/udp_relay.py``: seeded random loss, 0..40 ms holds),
against the echo server: what the model heard is what comes back, so each 80 ms frame of the caller's speech is
followed from the caller's mouth to the caller's ear.

A frame reached the model unless a piece of it is missing from the echo (what follows comes earlier) or silent
in it (``_helpers.webrtc.lost_frames``): a concealed packet is made up, heard, and so counts as reached, even
where it is silent (Opus's concealment at a word's start: the relay says which packets it dropped). The
turnaround is from when the caller's microphone sent a frame to when its echo
was heard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from typing import Any

import numpy as np
import pytest

from _helpers.aio import run_asyncio
from _helpers.udp_relay import Direction, UdpRelay
from _helpers.webrtc import FRAME, PACKET, RATE, Caller, echo_lags, echoed_frames, lost_frames

# What each end heard under loss and jitter, on real time and real sockets: run alone, after the parallel suite.
pytestmark = pytest.mark.serial

PACKET_KINDS = ("received", "recovered", "concealed", "late")


@dataclasses.dataclass
class Heard:
    """One caller's call through its relay: what came back, and what the relay did."""

    caller: Caller
    relay: UdpRelay
    said_at: int  # the microphone's sample the speech began at
    reports: dict[str, Any]  # the caller's stats (aiortc's) of the server's RTCP reports, by type, before hanging up
    sessions_during: int  # sessions open just before hanging up

    def frames(self, speech: np.ndarray) -> list[tuple[int, int, float]]:
        return echoed_frames(speech, self.caller.received())

    def lost(self, speech: np.ndarray) -> tuple[list[int], int]:
        """The speech frames that did not reach the model whole, and how many speech frames there are."""
        return lost_frames(speech, self.caller.received(), self.dropped_pieces())

    def dropped_pieces(self) -> frozenset[int]:
        """The 20 ms pieces of the speech whose packets the relay dropped (aiortc's caller sends a packet a
        piece, numbered on from the microphone's first)."""
        up = self.relay.up
        if up.rtp_first is None:
            return frozenset()
        return frozenset(((n - up.rtp_first) & 0xFFFF) - self.said_at // PACKET for n in up.rtp_dropped_numbers)

    def turnaround(self, speech: np.ndarray) -> float:
        """The median from a speech frame leaving the microphone to its echo being heard, in seconds."""
        mic = self.caller.microphone
        assert mic.started_at is not None
        times = []
        ends = np.cumsum([piece.size for piece in self.caller.audio])  # (where each piece aiortc handed out ends)
        for k, lag, similarity in self.frames(speech):
            if similarity > 0.5:
                heard = self.caller.audio_at[int(np.searchsorted(ends, k * FRAME + lag, side="right"))]
                times.append(heard - (mic.started_at + (self.said_at + (k + 1) * FRAME) / RATE))
        return statistics.median(times)


def packets(server) -> dict[str, float]:
    lines = server.get_text("/metrics").splitlines()
    counts = dict.fromkeys(PACKET_KINDS, 0.0)
    for kind in PACKET_KINDS:
        for line in lines:
            if line.startswith(f'pplex_webrtc_packets_total{{kind="{kind}"}}'):
                counts[kind] = float(line.rsplit(" ", 1)[1])
    return counts


def calls(server, speech: np.ndarray, relays: list[UdpRelay]) -> list[Heard]:
    """One call per relay at once, each caller saying ``speech`` once its channel is open; all hang up once the
    echo is back."""

    async def run() -> list[Heard]:
        callers = [Caller() for _ in relays]
        for caller, relay in zip(callers, relays):
            response = await caller.call(server.url, through=relay)
            assert response.status_code == 201, response.text
        said = []
        for caller in callers:
            await asyncio.wait_for(caller.opened.wait(), 30)  # (a lost DTLS flight waits a second for its retry)
        await asyncio.sleep(1.0)  # (the framer has found the caller's phase)
        said = [caller.microphone.say(speech) for caller in callers]
        await asyncio.sleep(speech.size / RATE + 2.5)
        during = len((await asyncio.to_thread(server.get, "/api/sessions"))["sessions"])
        reports = []
        for caller in callers:
            stats = (await caller.pc.getStats()).values()
            reports.append({s.type: s for s in stats if s.type in ("remote-inbound-rtp", "remote-outbound-rtp")})
        for caller in callers:
            await caller.close()
        return [Heard(*call, during) for call in zip(callers, relays, said, reports)]

    try:
        return run_asyncio(run())
    finally:
        for relay in relays:
            relay.close()


@pytest.fixture(scope="module")
def lossless_and_lossy(echo_server, speech):
    """A lossless call and one with 5 % of the caller's packets lost, side by side on one server (the same
    machine, the same moment), and the server's packet counts over them."""
    before = packets(echo_server)
    heard = calls(echo_server, speech, [UdpRelay(seed=1), UdpRelay(up=Direction(loss=0.05), seed=2)])
    after = packets(echo_server)
    return heard, {kind: after[kind] - before[kind] for kind in PACKET_KINDS}


def test_at_5_percent_loss_99_percent_of_the_speech_frames_reach_the_model(lossless_and_lossy, speech):
    (clean, lossy), counts = lossless_and_lossy
    assert lossy.relay.up.rtp_dropped >= 3  # (the seed loses some: the test tests something)
    lost, frames = lossy.lost(speech)
    assert frames - len(lost) >= 0.99 * frames, f"speech frames {lost} of {frames} did not reach the model"
    assert clean.lost(speech) == ([], frames)
    # Each packet the callers sent was heard, recovered or concealed (the last one or two lost may not be).
    sent = clean.relay.up.rtp_sent + lossy.relay.up.rtp_sent
    assert counts["received"] == pytest.approx(sent - lossy.relay.up.rtp_dropped, abs=4)
    made_up = counts["recovered"] + counts["concealed"]
    assert lossy.relay.up.rtp_dropped - 2 <= made_up <= lossy.relay.up.rtp_dropped
    assert counts["received"] + made_up == pytest.approx(sent, abs=6)


def test_the_callers_hear_from_the_server_what_they_lost_and_what_it_sent(lossless_and_lossy):
    """The server's RTCP reports (a browser sets its Opus FEC by the losses they tell): the caller's sender learns
    its losses and its round trip, its receiver what the server's voice sent."""
    (clean, lossy), _ = lossless_and_lossy
    for heard, most in ((clean, 0), (lossy, lossy.relay.up.rtp_dropped)):
        told = heard.reports["remote-inbound-rtp"]  # (from the last report: losses after it are not in it)
        assert (most == 0 and told.packetsLost == 0) or 0 < told.packetsLost <= most
        assert told.roundTripTime is not None and 0 <= told.roundTripTime < 1.0  # (our report answered its own)
        assert heard.reports["remote-outbound-rtp"].packetsSent > 100  # (the server's voice: 50 a second)


def test_at_5_percent_loss_the_turnaround_stays_within_40_ms_of_the_lossless_calls(lossless_and_lossy, speech):
    (clean, lossy), _ = lossless_and_lossy
    before, after = clean.turnaround(speech), lossy.turnaround(speech)
    assert after - before <= 0.040, f"turnaround {before * 1000:.0f} ms lossless, {after * 1000:.0f} ms at 5 %"


def test_at_15_percent_loss_and_40_ms_of_jitter_the_call_goes_on_and_the_speech_is_recognizable(echo_server, speech):
    before = packets(echo_server)
    relay = UdpRelay(up=Direction(loss=0.15, jitter=0.04), seed=3)
    (heard,) = calls(echo_server, speech, [relay])
    after = packets(echo_server)
    assert heard.sessions_during == 1  # (still on when the caller hung up)
    lost = heard.relay.up.rtp_dropped
    assert lost >= 0.1 * heard.relay.up.rtp_sent
    made_up = after["recovered"] + after["concealed"] - before["recovered"] - before["concealed"]
    # (not all: a packet lost before the first one that came, or after the last, is nobody's to make up)
    assert 0.85 * lost <= made_up <= lost + after["late"] - before["late"]
    # Each half second of the speech is in what came back (the way back is clean: aiortc's caller conceals
    # nothing, so what it hears is what the model heard).
    found = echo_lags(speech, heard.caller.received())
    assert all(correlation > 0.5 for _, correlation in found), f"the echo, half second by half second: {found}"


def test_40_ms_of_jitter_alone_is_put_back_in_order(echo_server, speech):
    before = packets(echo_server)
    (heard,) = calls(echo_server, speech, [UdpRelay(up=Direction(jitter=0.04), seed=4)])
    after = packets(echo_server)
    assert heard.relay.up.dropped == 0 and heard.relay.up.rtp_overtaken >= 10  # (reordered: some 12 % of them)
    made_up = after["recovered"] + after["concealed"] - before["recovered"] - before["concealed"]
    assert made_up <= 3 and after["late"] - before["late"] <= 3
    assert heard.lost(speech)[0] == []


@pytest.mark.parametrize("at", [0.3, 0.7, 1.2, 1.8])
def test_the_count_finds_audio_missing_or_silenced_not_a_late_tick_or_a_concealment(speech, at):
    """``lost_frames`` itself, on a made-up echo (the speech 0.3 s late): 20 ms cut out or silenced loses a
    frame; 80 ms of silence before a frame (heard a tick late) or 20 ms made up from the last loses none."""
    echo = np.concatenate([np.zeros(int(0.3 * RATE), np.float32), speech, np.zeros(RATE, np.float32)])
    cut = int(0.3 * RATE) + int(at * RATE) // 960 * 960  # (a packet's place)
    frame = int(at * RATE) // FRAME
    assert lost_frames(speech, echo) == ([], 23)
    # (a vowel's next 20 ms look like the missing ones: the gap may only show at the frame after)
    assert lost_frames(speech, np.concatenate([echo[:cut], echo[cut + 960 :]]))[0] in ([frame], [frame + 1])
    silenced = echo.copy()
    silenced[cut : cut + 960] = 0
    assert lost_frames(speech, silenced)[0] == [frame]
    piece = int(at * RATE) // 960
    assert lost_frames(speech, silenced, frozenset({piece}))[0] == []  # (its packet dropped: concealed, silent)
    assert lost_frames(speech, silenced, frozenset({piece + 2}))[0] == [frame]  # (another's drop: no excuse)
    late = np.concatenate([echo[:cut], np.zeros(FRAME, np.float32), echo[cut:]])
    assert lost_frames(speech, late)[0] == []
    concealed = echo.copy()
    concealed[cut : cut + 960] = 0.5 * echo[cut - 960 : cut]  # (what the packet before it said, fading)
    assert lost_frames(speech, concealed)[0] == []
