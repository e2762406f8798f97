// One conversation with the server: the WebSocket, its state, and the audio
// flowing both ways.
//
// Phases: connecting → (queued → preparing →) live → ended, and live → reconnecting → live
// when the socket drops mid-call and the server resumes the call (reconnect.js).
// The Moshi protocol only says "ready" (0x00); while we wait it sends pings.
// To tell "queued, position n" from "preparing the persona", the page polls
// /api/queue with a random ticket it passed in the /api/chat query (servers
// and clients that don't know the ticket simply ignore it).

import { AudioGraph, SAMPLE_RATE } from "./audio-graph.js";
import { OggOpusDecoder } from "./opus-decoder.js";
import { OggOpusEncoder } from "./opus-encoder.js";
import { chatUrl, decodeMessage, describeEnding, encodeAudio, encodeHangup } from "./protocol.js";
import { RECONNECT, isDrop, lostEnding, nextAttemptDelay } from "./reconnect.js";

const INACTIVITY_MS = 10_000; // as the official client: no message for 10 s means the server is gone
const QUEUE_POLL_MS = 1000;

export class Conversation {
  /**
   * @param {object} o
   * @param {string} o.pageUrl  where the page came from (the server)
   * @param {object} o.params  query parameters of /api/chat (persona, voice, sampling)
   * @param {boolean} o.voiceProcessing  echo cancellation, noise suppression, auto gain
   * @param {(state: object) => void} o.onState  {phase, position?, attempt?, resumed?, ending?}
   * @param {(text: string, speaker?: string) => void} o.onText  the agent's pieces, and the caller's ("caller") if asked
   * @param {AudioGraph} [o.audio]  the graph made in the click (already open when a WebRTC call fell back)
   */
  constructor({ pageUrl, params, voiceProcessing, onState, onText, audio }) {
    this.pageUrl = pageUrl;
    this.params = params;
    this.voiceProcessing = voiceProcessing;
    this.onState = onState;
    this.onText = onText;
    this.ticket = crypto.randomUUID();
    this.state = { phase: "idle" };
    this.serverError = null; // text of a 0x05 message, shown with the close
    this.resumeToken = null; // the latest 0x11 token: a drop from now on is reconnected
    this.ws = null; // the current socket; events of an older one are ignored
    this.audio = audio || new AudioGraph(); // now, inside the user's click
    this.transport = "WebSocket";
  }

  async start() {
    this._setState({ phase: "connecting" });
    try {
      if (!this.audio.stream) await this.audio.open({ voiceProcessing: this.voiceProcessing });
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
    this._open(chatUrl(this.pageUrl, { ...this.params, resumable: 1, ticket: this.ticket }));
  }

  _open(url) {
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.serverError = null;
    ws.onopen = () => {
      if (ws !== this.ws) return;
      this._touch();
      if (this.state.phase === "connecting") this._pollQueue();
    };
    ws.onmessage = (event) => {
      if (ws === this.ws) this._message(event.data);
    };
    ws.onclose = (event) => {
      if (ws === this.ws) this._closed(event.code, this.serverError || event.reason);
    };
  }

  /** The person ends the conversation: the server is told (0x12), so it does not hold the call for a resume. */
  stop() {
    if (this.state.phase === "ended") return;
    this._hangUp();
    this._end({ ok: true, text: "You ended the conversation." });
  }

  _hangUp() {
    const ws = this.ws;
    this.ws = null;
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(encodeHangup());
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000);
  }

  _closed(code, reason) {
    this.ws = null;
    if (this.resumeToken && isDrop(code, reason)) this._lost();
    else if (this.state.phase === "reconnecting") this._end(lostEnding(reason));
    else this._end(describeEnding(code, reason));
  }

  // The socket of a resumable call is gone: keep the audio graph running (the microphone's
  // blocks are dropped meanwhile: real-time audio is not queued) and reopen with backoff.
  _lost() {
    if (this.state.phase === "ended") return;
    clearTimeout(this._watchdog);
    if (this.state.phase !== "reconnecting") {
      this._lostAt = performance.now();
      this._attempt = 0;
      this._stopSending();
      // Whatever an attempt is doing, the server has ended the call by then.
      this._giveUp = setTimeout(() => {
        this._hangUp();
        this._end(lostEnding("no answer within the server's resume window"));
      }, RECONNECT.windowMs);
    }
    const attempt = this._attempt + 1;
    const delay = nextAttemptDelay(attempt, performance.now() - this._lostAt);
    if (delay === null) {
      this._end(lostEnding("no answer within the server's resume window"));
      return;
    }
    this._attempt = attempt;
    this._setState({ phase: "reconnecting", attempt });
    this._retry = setTimeout(() => {
      // The server ignores other settings on a resume; the ticket still names this call.
      this._open(chatUrl(this.pageUrl, { resume: this.resumeToken, ticket: this.ticket }));
    }, delay);
  }

  _stopSending() {
    this.audio.onMicBlock = null;
    if (this.encoder) this.encoder.close();
    this.encoder = null;
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
      case "resume":
        this.resumeToken = message.token; // each connection's newest token is the one that works
        if (message.notice) console.info("Server:", message.notice);
        break;
      default: // pings, metadata, kinds we don't know
        break;
    }
  }

  _goLive() {
    if (this.state.phase === "live" || this.state.phase === "ended") return;
    const resumed = this.state.phase === "reconnecting";
    clearTimeout(this._giveUp);
    this._setState({ phase: "live", resumed });
    // A new encoder on every connection, so the server's first audio message on it is our OpusHead page.
    const ws = this.ws;
    const encoder = new OggOpusEncoder({
      sampleRate: SAMPLE_RATE,
      onPage: (page) => {
        if (ws === this.ws && ws.readyState === WebSocket.OPEN) ws.send(encodeAudio(page));
      },
      onError: (e) => {
        this._hangUp();
        this._end({ ok: false, text: `The browser's Opus encoder failed (${e.message}).` });
      },
    });
    this.encoder = encoder;
    this.audio.onMicBlock = (pcm) => encoder.encode(pcm);
    if (!resumed) this.audio.startRecording();
  }

  // Any message from the server proves it is alive.
  _touch() {
    clearTimeout(this._watchdog);
    this._watchdog = setTimeout(() => {
      const ws = this.ws;
      this.ws = null;
      if (ws) ws.close(1000);
      if (this.resumeToken) this._lost(); // a dead path, maybe: the server holds the call for a resume
      else this._end({ ok: false, text: `The server stopped responding (no message for ${INACTIVITY_MS / 1000} s).` });
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
    clearTimeout(this._retry);
    clearTimeout(this._giveUp);
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
