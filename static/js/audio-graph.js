// The page's Web Audio graph, one per conversation:
//
//   microphone ──► capture worklet ──► (20 ms blocks) ──► Opus encoder
//        └───────────────────────────────┐
//   decoded server audio ──► player worklet ──► speakers
//                                  └──► tape worklet (left: model, right: mic)
//
// The AudioContext runs at 48 kHz, Opus's own rate: the browser converts the
// microphone and the speakers to and from it, Opus carries the audio at the
// model's 24 kHz on the wire (the server encodes and decodes at 24 kHz), and
// browsers' Opus decoders give 48 kHz whatever they are asked for (Chromium
// does).  So nothing in this app resamples.

import { Recording } from "./recording.js";

export const SAMPLE_RATE = 48000;
export const BLOCK_SAMPLES = SAMPLE_RATE / 50; // 20 ms, one Opus packet

// Jitter buffer: the server sends 80 ms per tick, so start with a little more
// than one tick in hand; far beyond that we are just adding delay.
const PLAYER_OPTIONS = {
  startSamples: Math.round(0.09 * SAMPLE_RATE),
  maxSamples: Math.round(0.4 * SAMPLE_RATE),
  fadeSamples: Math.round(0.004 * SAMPLE_RATE),
  statsEvery: Math.round(0.05 * SAMPLE_RATE),
};

const workletUrl = (name) => new URL(`./worklets/${name}`, import.meta.url);

export class AudioGraph {
  /**
   * Create it inside a click handler, before any await: browsers only let a
   * page start audio in response to a user gesture.
   */
  constructor() {
    this.context = new AudioContext({ sampleRate: SAMPLE_RATE, latencyHint: "interactive" });
    this.recording = new Recording(SAMPLE_RATE);
    this.onMicBlock = null; // (pcm: Float32Array) => void, while sending
    this.micLevel = 0;
    this.playerStats = { played: 0, missed: 0, dropped: 0, underruns: 0, buffered: 0, level: 0 };
    this.stream = null;
  }

  /** Ask for the microphone and build the graph. Throws a readable Error if it cannot. */
  async open({ voiceProcessing = true } = {}) {
    const ctx = this.context;
    await ctx.resume();
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("This page needs microphone access, which browsers only give to https:// pages or localhost.");
    }
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: {
          channelCount: 1,
          // On by default, as a phone call would be; off gives the raw microphone
          // (useful with headphones, or to measure the audio path).
          echoCancellation: voiceProcessing,
          noiseSuppression: voiceProcessing,
          autoGainControl: voiceProcessing,
        },
      });
    } catch (e) {
      throw new Error(
        e.name === "NotAllowedError"
          ? "Microphone access was denied. Allow it in the browser's site settings and connect again."
          : `No microphone available (${e.name}: ${e.message}).`,
      );
    }
    await Promise.all(
      ["capture-worklet.js", "player-worklet.js", "tape-worklet.js"].map((name) => ctx.audioWorklet.addModule(workletUrl(name))),
    );
    const mono = { channelCount: 1, channelCountMode: "explicit", channelInterpretation: "speakers" };

    // Nodes whose output nobody hears are still pulled through this silent sink.
    const sink = new GainNode(ctx, { gain: 0 });
    sink.connect(ctx.destination);

    const mic = ctx.createMediaStreamSource(this.stream);
    this.capture = new AudioWorkletNode(ctx, "capture-processor", {
      ...mono,
      numberOfInputs: 1,
      numberOfOutputs: 1,
      processorOptions: { blockSize: BLOCK_SAMPLES },
    });
    this.capture.port.onmessage = ({ data }) => {
      this.micLevel = data.rms;
      if (this.onMicBlock) this.onMicBlock(data.pcm);
    };
    mic.connect(this.capture).connect(sink);

    this.player = new AudioWorkletNode(ctx, "player-processor", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: PLAYER_OPTIONS,
    });
    this.player.port.onmessage = ({ data }) => {
      if (data.type === "stats" && !this.remote) this.playerStats = data; // (over WebRTC: the receiver's)
    };
    this.player.connect(ctx.destination);

    this.tape = new AudioWorkletNode(ctx, "tape-processor", { ...mono, numberOfInputs: 2, numberOfOutputs: 1 });
    this._tapeStopped = null;
    this.tape.port.onmessage = ({ data }) => {
      if (data.type === "chunk") this.recording.add(data.left, data.right);
      if (data.type === "stopped" && this._tapeStopped) this._tapeStopped();
    };
    this.player.connect(this.tape, 0, 0);
    mic.connect(this.tape, 0, 1);
    this.tape.connect(sink);
  }

  /**
   * Over WebRTC: the server's audio arrives as a remote stream (the browser's own jitter buffer and decoder);
   * it plays and is recorded like the player's. A new stream (after a reconnection) replaces the last.
   */
  playStream(stream) {
    if (this.remote) this.remote.disconnect();
    // Chromium feeds a remote stream to Web Audio only while a media element plays it (muted: heard once).
    this.remoteElement ??= new Audio();
    this.remoteElement.muted = true;
    this.remoteElement.srcObject = stream;
    this.remoteElement.play().catch(() => {});
    this.remote = this.context.createMediaStreamSource(stream);
    this.remote.connect(this.context.destination);
    this.remote.connect(this.tape, 0, 0);
  }

  /** Back to the player (the WebRTC call fell back to the WebSocket). */
  stopStream() {
    if (this.remote) this.remote.disconnect();
    this.remote = null;
    if (this.remoteElement) this.remoteElement.srcObject = null;
  }

  /** Decoded server audio to play. */
  play(pcm) {
    this.player.port.postMessage({ type: "pcm", pcm }, [pcm.buffer]);
  }

  startRecording() {
    this.tape.port.postMessage({ type: "start" });
  }

  /** The delay from a sample arriving to it leaving the speakers, in seconds. */
  latency() {
    const ctx = this.context;
    return this.playerStats.buffered / SAMPLE_RATE + (ctx.baseLatency || 0) + (ctx.outputLatency || 0);
  }

  /** Stop the microphone and the player; the recording stays available. */
  async close() {
    this.onMicBlock = null;
    if (this.stream) this.stream.getTracks().forEach((t) => t.stop());
    if (this.remoteElement) this.remoteElement.srcObject = null;
    if (this.player) this.player.port.postMessage({ type: "end" });
    if (this.tape) {
      const stopped = new Promise((resolve) => (this._tapeStopped = resolve));
      this.tape.port.postMessage({ type: "stop" });
      // The audio thread answers within a render quantum; don't hang if it is gone.
      await Promise.race([stopped, new Promise((r) => setTimeout(r, 500))]);
    }
    if (this.context.state !== "closed") await this.context.close();
  }
}
