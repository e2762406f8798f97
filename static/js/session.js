// One conversation with the server: the WebSocket, its state, and the audio
// flowing both ways.
//
// Phases: connecting → (queued → preparing →) live → ended.
// The Moshi protocol only says "ready" (0x00); while we wait it sends pings.
// To tell "queued, position n" from "preparing the persona", the page polls
// /api/queue with a random ticket it passed in the /api/chat query (servers
// and clients that don't know the ticket simply ignore it).

import { AudioGraph, SAMPLE_RATE } from "./audio-graph.js";
import { OggOpusDecoder } from "./opus-decoder.js";
import { OggOpusEncoder } from "./opus-encoder.js";
import { chatUrl, decodeMessage, describeEnding, encodeAudio } from "./protocol.js";

const INACTIVITY_MS = 10_000; // as the official client: no message for 10 s means the server is gone
const QUEUE_POLL_MS = 1000;

export class Conversation {
  /**
   * @param {object} o
   * @param {string} o.pageUrl  where the page came from (the server)
   * @param {object} o.params  query parameters of /api/chat (persona, voice, sampling)
   * @param {boolean} o.voiceProcessing  echo cancellation, noise suppression, auto gain
   * @param {(state: object) => void} o.onState  {phase, position?, ending?}
   * @param {(text: string, speaker?: string) => void} o.onText  the agent's pieces, and the caller's ("caller") if asked
   */
  constructor({ pageUrl, params, voiceProcessing, onState, onText }) {
    this.pageUrl = pageUrl;
    this.params = params;
    this.voiceProcessing = voiceProcessing;
    this.onState = onState;
    this.onText = onText;
    this.ticket = crypto.randomUUID();
    this.state = { phase: "idle" };
    this.serverError = null; // text of a 0x05 message, shown with the close
    this.audio = new AudioGraph(); // now, inside the user's click
  }

  async start() {
    this._setState({ phase: "connecting" });
    try {
      await this.audio.open({ voiceProcessing: this.voiceProcessing });
    } catch (e) {
      this._end({ ok: false, text: e.message });
      return;
    }
    if (this.state.phase === "ended") return; // Disconnect while the microphone prompt was up
    this.decoder = new OggOpusDecoder({
      sampleRate: SAMPLE_RATE,
      onPcm: (pcm) => this.audio.play(pcm),
      onError: (e) => console.warn("Opus decoder:", e),
    });
    const ws = new WebSocket(chatUrl(this.pageUrl, { ...this.params, ticket: this.ticket }));
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      this._touch();
      this._pollQueue();
    };
    ws.onmessage = (event) => this._message(event.data);
    ws.onclose = (event) => this._end(describeEnding(event.code, this.serverError || event.reason));
  }

  /** The person ends the conversation. */
  stop() {
    if (this.state.phase === "ended") return;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000);
    this._end({ ok: true, text: "You ended the conversation." });
  }

  _message(data) {
    this._touch();
    if (typeof data === "string") return; // not part of the protocol
    const message = decodeMessage(data);
    switch (message.type) {
      case "handshake":
        this._goLive();
        break;
      case "audio":
        if (this.state.phase === "live") this.decoder.push(message.ogg);
        break;
      case "text":
        this.onText(message.text);
        break;
      case "caller_text":
        this.onText(message.text, "caller");
        break;
      case "error":
        this.serverError = message.message;
        break;
      default: // pings, metadata, kinds we don't know
        break;
    }
  }

  _goLive() {
    if (this.state.phase === "live" || this.state.phase === "ended") return;
    this._setState({ phase: "live" });
    // The encoder starts now, so the server's first audio message is our OpusHead page.
    this.encoder = new OggOpusEncoder({
      sampleRate: SAMPLE_RATE,
      onPage: (page) => {
        if (this.ws.readyState === WebSocket.OPEN) this.ws.send(encodeAudio(page));
      },
      onError: (e) => {
        this.serverError = `the browser's Opus encoder failed (${e.message})`;
        this.ws.close(1000);
      },
    });
    this.audio.onMicBlock = (pcm) => this.encoder.encode(pcm);
    this.audio.startRecording();
  }

  // Any message from the server proves it is alive.
  _touch() {
    clearTimeout(this._watchdog);
    this._watchdog = setTimeout(() => {
      this.serverError = `no message from the server for ${INACTIVITY_MS / 1000} s`;
      this.ws.close(1000);
      this._end({ ok: false, text: `The server stopped responding (${this.serverError}).` });
    }, INACTIVITY_MS);
  }

  async _pollQueue() {
    while (["connecting", "queued", "preparing"].includes(this.state.phase)) {
      try {
        const response = await fetch(new URL(`/api/queue?ticket=${encodeURIComponent(this.ticket)}`, this.pageUrl));
        if (response.ok) {
          const status = await response.json();
          if (this.state.phase !== "live" && this.state.phase !== "ended") {
            if (status.state === "queued") this._setState({ phase: "queued", position: status.position });
            else if (status.state === "preparing") this._setState({ phase: "preparing" });
          }
        }
      } catch {
        // A failed poll changes nothing: the socket tells us when things really end.
      }
      await new Promise((resolve) => setTimeout(resolve, QUEUE_POLL_MS));
    }
  }

  _end(ending) {
    if (this.state.phase === "ended") return;
    clearTimeout(this._watchdog);
    if (this.encoder) this.encoder.close();
    if (this.decoder) this.decoder.close();
    this.audioClosed = this.audio.close(); // resolves once the recording has its last samples
    this._setState({ phase: "ended", ending });
  }

  _setState(state) {
    this.state = state;
    this.onState(state);
  }
}
