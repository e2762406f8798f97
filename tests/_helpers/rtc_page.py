"""WebRTC in the browser for the tests: a fake microphone that speaks, a page that calls the server the way
OpenAI's documentation describes it, and the check that what the page heard is what its microphone said.

The page records in one ``AudioContext`` what it hears (left) and what its microphone gives (right), sample
aligned, so the echo engine's echo is found at one lag however long the call took to set up.
"""

from __future__ import annotations

import base64
import pathlib
import wave

import numpy as np
import soxr

from _helpers.audio import best_lag

RATE = 48_000
# speech_assistant.wav's first utterance (3.0 s to 7.5 s): Chromium loops the file, so a lag under its
# length is never ambiguous.
SPEECH_FROM_S, SPEECH_TO_S = 3.0, 7.5
PIECE = RATE // 2


def write_speech(shared_dir: pathlib.Path, path: pathlib.Path) -> None:
    """The fake microphone's file: the utterance at 48 kHz, 16-bit mono."""
    with wave.open(str(shared_dir / "data" / "speech_assistant.wav")) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768
    clip = soxr.resample(pcm[int(SPEECH_FROM_S * rate) : int(SPEECH_TO_S * rate)], rate, RATE)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.round(np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes())


# The browser side of a call, written from OpenAI's description of its WebRTC flow: a peer connection with the
# microphone's track and the ``oai-events`` data channel, its offer posted, the answer applied, the events kept.
# ``realtimeCall`` posts the offer as application/sdp with an ephemeral key; ``liveCall`` as the Live API's JSON.
# ``record`` (ours) keeps both sides for ``seconds`` once the remote track plays.
CALL_PAGE = """<!doctype html><meta charset="utf-8"><title>WebRTC call</title>
<script>
const events = [];
let pc;

async function connect(post) {
  pc = new RTCPeerConnection();
  const heard = new Promise((resolve) => (pc.ontrack = (event) => resolve(event.streams[0])));
  const mic = await navigator.mediaDevices.getUserMedia({ audio: true });
  pc.addTrack(mic.getTracks()[0]);
  const channel = pc.createDataChannel("oai-events");
  channel.addEventListener("message", (event) => events.push(JSON.parse(event.data)));
  const offer = await pc.createOffer();
  await pc.setLocalDescription(offer);
  const answer = await post(offer.sdp);
  if (answer.sdp === undefined) return answer;
  await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
  return { ...answer, mic, heard: await heard };
}

async function realtimeCall(baseUrl, key, seconds) {
  const call = await connect(async (sdp) => {
    const response = await fetch(baseUrl + "/realtime/calls", {
      method: "POST",
      body: sdp,
      headers: { Authorization: "Bearer " + key, "Content-Type": "application/sdp" },
    });
    if (!response.ok) return { status: response.status, error: await response.text() };
    return { status: response.status, location: response.headers.get("Location"), sdp: await response.text() };
  });
  return finish(call, seconds);
}

async function liveCall(baseUrl, session, seconds) {
  const call = await connect(async (sdp) => {
    const response = await fetch(baseUrl + "/live/sessions", {
      method: "POST",
      body: JSON.stringify({ session, transport: { type: "webrtc", sdp } }),
      headers: { "Content-Type": "application/json" },
    });
    if (!response.ok) return { status: response.status, error: await response.text() };
    const body = await response.json();
    return { status: response.status, id: body.session.id, sdp: body.transport.sdp };
  });
  return finish(call, seconds);
}

async function finish(call, seconds) {
  if (call.heard === undefined) return call;
  const { mic, heard, ...rest } = call;
  const tape = await record(heard, mic, seconds);
  pc.close();
  mic.getTracks().forEach((track) => track.stop());
  return { ...rest, ...tape, events };
}

// Both streams into one 48 kHz context, a channel each, kept block by block.
async function record(heard, mic, seconds) {
  const player = new Audio();
  player.srcObject = heard; // (Chromium feeds a remote stream to Web Audio only while an element plays it)
  player.muted = true;
  player.play();
  const context = new AudioContext({ sampleRate: 48000 });
  await context.resume();
  const merger = new ChannelMergerNode(context, { numberOfInputs: 2 });
  context.createMediaStreamSource(heard).connect(merger, 0, 0);
  context.createMediaStreamSource(mic).connect(merger, 0, 1);
  const tap = context.createScriptProcessor(4096, 2, 1);
  const left = [], right = [];
  tap.onaudioprocess = (event) => {
    left.push(new Float32Array(event.inputBuffer.getChannelData(0)));
    right.push(new Float32Array(event.inputBuffer.getChannelData(1)));
  };
  merger.connect(tap).connect(context.destination);
  await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  await context.close();
  return { left: pcm16(left), right: pcm16(right), rate: context.sampleRate };
}

function pcm16(blocks) {
  const samples = new Int16Array(blocks.reduce((n, b) => n + b.length, 0));
  let at = 0;
  for (const block of blocks) for (const v of block) samples[at++] = Math.max(-1, Math.min(1, v)) * 32767;
  let text = "";
  const bytes = new Uint8Array(samples.buffer);
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}
</script>"""


def tape(encoded: str) -> np.ndarray:
    """One channel of the page's recording as float."""
    return np.frombuffer(base64.b64decode(encoded), "<i2").astype(np.float64) / 32768


def echo_lag(
    heard: np.ndarray, mic: np.ndarray, *, skip_s: float = 1.0, max_lag_s: float = 1.5, spread_s: float = 0.08
) -> float:
    """The echo engine sent the microphone back: every audible half second of ``mic`` (after ``skip_s``) is
    found in ``heard`` at one lag (within ``spread_s``: a frame, 80 ms, unless the player missed audio and so
    plays later since) under ``max_lag_s``; returns that lag in seconds.

    The browser's jitter buffer stretches and shrinks what it plays by a few milliseconds when it adapts, so a
    half second across such a change matches a little less well (correlation over 0.7, most over 0.85: Opus
    twice, and the two clocks); one may miss it, as one straddling such a change does."""
    found = []
    max_lag = int(max_lag_s * RATE)
    for start in range(int(skip_s * RATE), mic.size - PIECE - max_lag, PIECE):
        piece = mic[start : start + PIECE]
        if np.sqrt(np.mean(piece**2)) < 0.02:  # (a pause: nothing to find)
            continue
        lag, correlation = best_lag(piece, heard[start:], 0, max_lag)
        found.append((lag / RATE, correlation))
    report = ", ".join(f"{c:.3f} at {lag:.3f} s" for lag, c in found)
    assert len(found) >= 4, f"too little speech recorded to check the echo: {report}"
    correlations = sorted(c for _, c in found)
    # (one half second may miss the bar, as one that straddles a change of the jitter buffer or a framing shift)
    assert correlations[1] > 0.7 and np.median(correlations) > 0.85, f"the microphone did not come back: {report}"
    lags = [lag for lag, c in found if c > 0.7]
    assert max(lags) - min(lags) <= spread_s, f"the echo is out of time: {report}"
    return float(np.median(lags))
