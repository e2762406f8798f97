"""A WebRTC caller for the tests: aiortc's own peer connection, as a Python app would use it, on asyncio.

``Caller`` plays a signal as its microphone (20 ms frames at 48 kHz, in real time, then silence), opens the
``oai-events`` data channel, posts its offer to one of the server's WebRTC routes and keeps what comes back:
the events (parsed) and the audio (mono float32 at 48 kHz, decoded by aiortc).
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
from typing import Any

import av
import httpx
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from _helpers.audio import best_lag, best_window
from pplex_trio.codec import is_silent

RATE = 48_000
PACKET = 960
PIECE = RATE // 2  # half a second


class Microphone(MediaStreamTrack):
    """``signal`` (float32 at 48 kHz) in 20 ms frames at real time from the first frame asked for, then silence."""

    kind = "audio"

    def __init__(self, signal: np.ndarray | None = None) -> None:
        super().__init__()
        self.signal = np.zeros(0, np.float32) if signal is None else signal
        self.started_at: float | None = None  # time.monotonic() of the first frame sent
        self._pts = 0

    def say(self, signal: np.ndarray) -> int:
        """Say ``signal`` from the next frame on (after what is left of the last); the sample it starts at."""
        said = self.signal[: self._pts]
        said = np.pad(said, (0, self._pts - said.size))  # (silence went out meanwhile)
        left = self.signal[self._pts :]
        self.signal = np.concatenate([said, left, signal])
        return said.size + left.size

    async def _paced(self) -> None:
        """Wait for the next frame's time (real time from the first)."""
        if self.started_at is None:
            self.started_at = time.monotonic()
        else:
            delay = self.started_at + self._pts / RATE - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def recv(self) -> av.AudioFrame:
        await self._paced()
        piece = self.signal[self._pts : self._pts + PACKET]
        piece = np.pad(piece, (0, PACKET - piece.size))
        samples = np.round(np.clip(piece, -1, 1) * 32767).astype(np.int16)
        # (stereo, both channels the signal: PyAV would upmix a mono frame 3 dB down)
        frame = av.AudioFrame.from_ndarray(np.repeat(samples, 2).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._pts, fractions.Fraction(1, RATE)
        self._pts += PACKET
        return frame


class Caller:
    """One WebRTC call from aiortc (see the module's doc)."""

    def __init__(
        self, signal: np.ndarray | None = None, *, channel: bool = True, microphone: Microphone | None = None
    ) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.microphone = Microphone(signal) if microphone is None else microphone
        self.pc.addTrack(self.microphone)
        self.channel = self.pc.createDataChannel("oai-events") if channel else None
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self.audio: list[np.ndarray] = []
        self.audio_at: list[float] = []  # when each piece came (time.monotonic())
        self.location: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.opened = asyncio.Event()
        if self.channel is not None:
            self.channel.on("message", self._on_message)
            self.channel.on("open", self.opened.set)
        self.pc.on("track", self._on_track)

    def _on_message(self, message: str | bytes) -> None:
        self.raw.append(message if isinstance(message, str) else message.decode())
        self.events.append(json.loads(self.raw[-1]))

    def _on_track(self, track: Any) -> None:
        self._tasks.append(asyncio.ensure_future(self._listen(track)))

    async def _listen(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except Exception:  # (the track ended)
                return
            assert (frame.format.name, frame.layout.name, frame.sample_rate) == ("s16", "stereo", RATE)
            left = frame.to_ndarray().reshape(-1, 2)[:, 0]  # (the voice is the same on both channels)
            self.audio.append(left.astype(np.float32) / 32768)
            self.audio_at.append(time.monotonic())

    async def offer(self) -> str:
        """The caller's offer (its candidates gathered)."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def call(
        self,
        url: str,
        *,
        path: str = "/v1/realtime/calls",
        token: str | None = None,
        session: dict[str, Any] | None = None,
        live: bool = False,
        offer: str | None = None,
        apply: bool = True,
        through: Any = None,
    ) -> httpx.Response:
        """Post the offer (``live``: as ``client.live.create``'s JSON; ``session``: as the multipart form) and
        apply the answer (unless not ``apply``); the response. ``through``: a ``udp_relay.UdpRelay`` the call's
        packets take (both descriptions rewritten by it)."""
        offer = offer or await self.offer()
        if through is not None:
            offer = through.offer(offer)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(timeout=20, trust_env=False) as http:
            if live:
                body = {"session": session or {}, "transport": {"type": "webrtc", "sdp": offer}}
                response = await http.post(url + path, json=body, headers=headers)
            elif session is not None:
                files = {"sdp": (None, offer, "application/sdp"), "session": (None, json.dumps(session))}
                response = await http.post(url + path, files=files, headers=headers)
            else:
                headers["Content-Type"] = "application/sdp"
                response = await http.post(url + path, content=offer, headers=headers)
        if response.status_code >= 400:
            return response
        answer = response.json()["transport"]["sdp"] if live else response.text
        self.location = response.headers.get("location") or f"{path}/{response.json()['session']['id']}"
        if through is not None:
            answer = through.answer(answer)
        if apply:
            await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        return response

    async def answer(self, sdp: str) -> None:
        """Apply the server's answer (got some other way than :meth:`call`)."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp, "answer"))

    def send(self, event: dict[str, Any]) -> None:
        """An event on the data channel."""
        assert self.channel is not None
        self.channel.send(json.dumps(event))

    def received(self) -> np.ndarray:
        """The audio received so far (mono float32 at 48 kHz)."""
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        """The events of one ``type`` received so far."""
        return [event for event in self.events if event["type"] == kind]

    async def wait_for(self, kind: str, timeout: float = 10) -> dict[str, Any]:
        """The first event of ``kind``, waiting for it."""
        deadline = time.monotonic() + timeout
        while not self.of_type(kind):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind} within {timeout} s; got {[e['type'] for e in self.events]}")
            await asyncio.sleep(0.02)
        return self.of_type(kind)[0]

    async def close(self) -> None:
        """Hang up (the peer connection closes) and stop listening."""
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def echo_lags(utterance: np.ndarray, received: np.ndarray) -> list[tuple[float, float]]:
    """Each half second of ``utterance`` found in ``received``: (its lag in seconds, its correlation there)."""
    found = []
    for k in range(utterance.size // PIECE):
        piece = utterance[k * PIECE : (k + 1) * PIECE]
        lag, correlation = best_lag(piece, received, 0, received.size - piece.size)
        found.append(((lag - k * PIECE) / RATE, correlation))
    return found


def assert_echoed(utterance: np.ndarray, received: np.ndarray) -> float:
    """The utterance came back whole and in order: each half second found at its place (Opus twice: correlation
    above 0.8; one piece may miss, as one straddling a shift does), the pieces within two frames (160 ms) of one
    another: a tick that found no whole frame of the caller's audio waiting fed the model silence, which delays
    the rest by a frame (``tests/compat``'s check, for the same reason). Returns the first piece's lag (seconds
    into ``received``)."""
    found = echo_lags(utterance, received)
    report = ", ".join(f"{c:.3f} at {lag:.3f} s" for lag, c in found)
    good = [lag for lag, c in found if c > 0.8]
    assert len(good) >= len(found) - 1, f"the caller's speech did not come back: {report}"
    assert max(good) - min(good) <= 0.16, f"the echo is out of time: {report}"
    return good[0]


FRAME = 3840  # the model's 80 ms frame, at 48 kHz


def _first_lag(utterance: np.ndarray, received: np.ndarray) -> int:
    """Where the echo of ``utterance`` starts in ``received``: the earliest lag at which one of its 80 ms frames is
    clearly there (a frame heard a tick late only pushes what follows later), else where its first half second
    is most like it."""
    clear = []
    for k in range(utterance.size // FRAME):
        frame = utterance[k * FRAME : (k + 1) * FRAME]
        if not is_silent(frame) and (found := best_window(frame, received))[1] > 0.9:
            clear.append(found[0] - k * FRAME)
    return min(clear) if clear else best_window(utterance[:PIECE], received)[0]


def lost_frames(
    utterance: np.ndarray, received: np.ndarray, dropped: frozenset[int] = frozenset()
) -> tuple[list[int], int]:
    """Which 80 ms frames of ``utterance`` (those that are speech) did not come back whole in ``received`` (an
    echo of it), and how many speech frames there are.

    The echo starts at :func:`_first_lag`. Each 20 ms piece that is speech is then looked for where the last one
    was found (give or take 2 ms); failing that, from 40 ms before to 400 ms after. Found 15 ms or more later, a
    late frame pushed the rest later (the model heard it a tick late); found 15 ms or more earlier, audio before
    it went missing: its frame is lost. (Either only if the 60 ms after it are there too, and no longer at the
    old lag.) A piece found nowhere (a cosine similarity of 0.7 or less) was concealed (heard, made up) unless
    the echo is silent where it should be, by the pieces found before and after it, and its packet was not one the
    network ``dropped`` (their numbers: the pieces'): a lost packet's concealment (Opus's PLC) is made from what
    came before it, so at the start of a word it is silent, and yet heard in its place."""
    lag = _first_lag(utterance, received)
    slack, step = RATE // 500, 3 * RATE // 200  # 2 ms; 15 ms (a lost packet moves what follows by 20)
    lost: set[int] = set()
    unfound: list[tuple[int, int]] = []  # (piece, the lag before it)
    frames = [k for k in range(utterance.size // FRAME) if not is_silent(utterance[k * FRAME : (k + 1) * FRAME])]

    def silent_at(k: int, at: int) -> bool:
        piece = utterance[k * PACKET : (k + 1) * PACKET]
        there = received[k * PACKET + at + slack : (k + 1) * PACKET + at - slack]  # (a lag a few samples off)
        return not {k, k - 1} & dropped and bool(np.sqrt(np.mean(there**2)) < 0.1 * np.sqrt(np.mean(piece**2)))

    for k in range(utterance.size // PACKET):
        piece = utterance[k * PACKET : (k + 1) * PACKET]
        if is_silent(piece) or k // 4 not in frames:
            continue
        place = k * PACKET + lag
        if place + 6 * PACKET > received.size:
            lost.add(k // 4)
            continue
        if best_window(piece, received[place - slack : place + PACKET + slack])[1] > 0.7:
            found = True
        else:
            start = max(0, place - 2 * PACKET)
            at, similarity = best_window(piece, received[start : place + 21 * PACKET])
            moved = start + at - place
            # Only if the 60 ms after it are there too, and no longer at the old lag (not a look-alike a few
            # pitch periods off, beside a concealed piece).
            following = utterance[(k + 1) * PACKET : (k + 4) * PACKET]
            there = received[place + moved + PACKET - slack : place + moved + 4 * PACKET + slack]
            before = received[place + PACKET - slack : place + 4 * PACKET + slack]
            found = (
                similarity > 0.7
                and following.size == 3 * PACKET
                and there.size > following.size
                and best_window(following, there)[1] > 0.7
                and (before.size <= following.size or best_window(following, before)[1] <= 0.7)
            )
            if found and moved <= -step:
                lost.add(k // 4)
            if found and abs(moved) >= step:
                lag += moved
        if found:
            lost.update(j // 4 for j, before in unfound if silent_at(j, before) and silent_at(j, lag))
            unfound = []
        else:
            unfound.append((k, lag))
    return sorted(lost | {j // 4 for j, before in unfound if silent_at(j, before)}), len(frames)


def echoed_frames(utterance: np.ndarray, received: np.ndarray) -> list[tuple[int, int, float]]:
    """Each 80 ms frame of ``utterance`` that is speech, followed through the echo in ``received``: (the frame's
    number, its lag into ``received`` in samples, its cosine similarity there). Placed as by :func:`lost_frames`,
    each frame is then looked for from 40 ms before the lag of the last one found to 200 ms after it."""
    lag = _first_lag(utterance, received)
    found = []
    for k in range(utterance.size // FRAME):
        frame = utterance[k * FRAME : (k + 1) * FRAME]
        if is_silent(frame):
            continue
        start = k * FRAME + max(0, lag - FRAME // 2)
        window = received[start : k * FRAME + lag + 5 * FRAME // 2 + FRAME]
        if window.size < FRAME:
            break
        at, similarity = best_window(frame, window)
        found.append((k, start + at - k * FRAME, similarity))
        if similarity > 0.5:  # (a frame not found says nothing of where the next one is)
            lag = found[-1][1]
    return found
