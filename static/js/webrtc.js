// One conversation over WebRTC, as OpenAI's browser flow has it: the microphone's track and the "oai-events"
// data channel on a peer connection, the offer POSTed to /v1/realtime/calls (OpenAI's multipart form, the
// persona and voice in its Realtime session), the answer applied.  The server's voice comes back on the remote
// track (the browser's own jitter buffer, decoder and loss concealment), its words as Realtime events.
//
// Before the call is live, an older server (404/501) or no connection within CONNECT_MS hands the conversation
// over to the WebSocket (onFallback).  Once live, a network change (the connection drops or fails) makes a new
// peer connection whose offer goes to the call's Location: the server keeps the session.  The interface is
// session.js's Conversation's, so the page treats both alike.

import { backoffDelay, lostEnding, RECONNECT } from "./reconnect.js";

const CONNECT_MS = 5000;
const STATS_MS = 250;

export const webRtcAvailable = () => typeof RTCPeerConnection !== "undefined";

/** The Realtime session of the page's settings (/api/chat's parameters): persona, voice, the caller's words. */
export function realtimeSession(params) {
  const audio = { output: {} };
  if (params.voice_prompt) audio.output.voice = params.voice_prompt;
  if (params.transcribe_caller) audio.input = { transcription: {} };
  const session = { type: "realtime", instructions: params.text_prompt, audio };
  if (params.audio_temperature !== undefined) session.temperature = Number(params.audio_temperature);
  return session;
}

class Fallback extends Error {}

export class WebRtcConversation {
  /**
   * @param {object} o  as Conversation's, but `session` (realtimeSession's) for `params`, the `audio` graph made
   *   in the click, and `onFallback(why)`: WebRTC cannot work here, the page goes on over the WebSocket
   */
  constructor({ pageUrl, session, audio, voiceProcessing, onState, onText, onFallback }) {
    Object.assign(this, { pageUrl, session, audio, voiceProcessing, onState, onText, onFallback });
    this.transport = "WebRTC";
    this.state = { phase: "idle" };
    this.pc = null; // the current peer connection; events of an older one are ignored, but:
    this.dropped = null; // the one a reconnection replaces, still heard until the new one is up (the server sends
    // each event once, on the connection it holds when it says it: until our new offer reaches it, the dropped one)
    this.location = null; // the call's URL, from the answer
    this.earlier = { played: 0, missed: 0 }; // counters of the call's earlier peer connections
    this.spokenItems = new Set(); // the caller's items whose words came piece by piece
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
    const form = (sdp) => {
      const body = new FormData();
      body.set("sdp", sdp);
      body.set("session", JSON.stringify(this.session));
      return { body };
    };
    try {
      const { pc, response } = await this._offer("/v1/realtime/calls", form);
      if (response.status === 404 || response.status === 501) {
        throw new Fallback(`this server does not take WebRTC calls (HTTP ${response.status})`);
      }
      if (!response.ok) throw new Error(await refusal(response));
      this.location = response.headers.get("Location");
      await this._answer(pc, response);
      this._goLive(false);
    } catch (e) {
      if (this.state.phase === "ended") return;
      if (e instanceof Fallback) this._fallBack(e.message);
      else this._end({ ok: false, text: e.message });
    }
  }

  /** The person ends the conversation: the call is hung up, then the peer connection closed. */
  stop() {
    if (this.state.phase === "ended") return;
    this._hangUp();
    this._end({ ok: true, text: "You ended the conversation." });
  }

  // A new peer connection (replacing any other, closed unless it is `keep`), its offer posted to `path`;
  // `request(sdp)`: the body and headers.
  async _offer(path, request, keep = null) {
    const pc = new RTCPeerConnection();
    const previous = this.pc;
    this.pc = pc;
    if (previous && previous !== keep) previous.close();
    pc.addTrack(this.audio.stream.getAudioTracks()[0], this.audio.stream);
    const channel = pc.createDataChannel("oai-events");
    this.opened = new Promise((resolve) => (channel.onopen = resolve));
    channel.onmessage = (e) => (pc === this.pc || pc === this.dropped) && this._event(JSON.parse(e.data));
    channel.onclose = () => pc === this.pc && this.state.phase === "live" && this._serverEnded();
    pc.ontrack = (e) => pc === this.pc && this.audio.playStream(e.streams[0] || new MediaStream([e.track]));
    pc.onconnectionstatechange = () => {
      if (pc === this.pc && ["disconnected", "failed"].includes(pc.connectionState)) this._reconnect();
    };
    await pc.setLocalDescription(await pc.createOffer());
    let response;
    try {
      response = await fetch(new URL(path, this.pageUrl), { method: "POST", ...request(pc.localDescription.sdp) });
    } catch (e) {
      throw new Fallback(`the WebRTC call could not be placed (${e.message})`);
    }
    return { pc, response };
  }

  // Apply the answer; connected (the data channel open) within CONNECT_MS, or the call is given up.
  async _answer(pc, response) {
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    let timer;
    const late = new Promise((resolve) => (timer = setTimeout(resolve, CONNECT_MS, "late")));
    const outcome = await Promise.race([this.opened, late]);
    clearTimeout(timer);
    if (outcome === "late") throw new Fallback(`the WebRTC call did not connect within ${CONNECT_MS / 1000} s`);
  }

  _goLive(resumed) {
    if (this.state.phase === "ended") return;
    this._setState({ phase: "live", resumed });
    if (!resumed) this.audio.startRecording();
    clearInterval(this._stats);
    const pc = this.pc;
    this._stats = setInterval(() => this._readStats(pc), STATS_MS);
  }

  // The network changed under a live call: new peer connections, their offers to the call, with backoff,
  // as long as the server holds the call (404: it has ended it).
  // The dropped connection stays open until the new one is up: closing it could reach the server, which
  // would end the call.
  async _reconnect() {
    if (this.state.phase !== "live") return;
    this._keepCounters();
    const dropped = (this.dropped = this.pc);
    try {
      await this._offerAgain(dropped);
    } finally {
      this.dropped = null;
      dropped.close();
    }
  }

  async _offerAgain(dropped) {
    const since = performance.now();
    const offer = (sdp) => ({ body: sdp, headers: { "Content-Type": "application/sdp" } });
    for (let attempt = 1; performance.now() - since < RECONNECT.windowMs; attempt++) {
      this._setState({ phase: "reconnecting", attempt });
      try {
        const { pc, response } = await this._offer(this.location, offer, dropped);
        if (this.state.phase === "ended") return;
        if (response.status === 404) break;
        if (response.ok) {
          await this._answer(pc, response);
          this._goLive(true);
          return;
        }
      } catch (e) {
        if (this.state.phase === "ended") return;
        console.warn("WebRTC reconnection:", e.message);
      }
      await new Promise((resolve) => setTimeout(resolve, backoffDelay(attempt)));
    }
    if (this.state.phase === "ended") return;
    this._hangUp();
    this._end(lostEnding("the server no longer holds the call"));
  }

  _event(event) {
    switch (event.type) {
      case "response.output_audio_transcript.delta":
        this.onText(event.delta);
        break;
      case "conversation.item.input_audio_transcription.delta":
        this.spokenItems.add(event.item_id);
        this.onText(event.delta, "caller");
        break;
      case "conversation.item.input_audio_transcription.completed":
        if (!this.spokenItems.has(event.item_id)) this.onText(event.transcript, "caller");
        break;
      case "error":
        this.serverError = event.error.message;
        console.warn("Server:", event.error.message);
        break;
      default: // the rest of the Realtime events: nothing the page shows
        break;
    }
  }

  // The page's statistics from the browser's receiver (played, concealed, its jitter buffer, the level).
  async _readStats(pc) {
    const report = await pc.getStats();
    if (pc !== this.pc) return;
    for (const s of report.values()) {
      if (s.type !== "inbound-rtp" || s.kind !== "audio") continue;
      this.last = { played: s.totalSamplesReceived || 0, missed: s.concealedSamples || 0 };
      const delay = s.jitterBufferEmittedCount ? s.jitterBufferDelay / s.jitterBufferEmittedCount : 0;
      this.audio.playerStats = {
        played: this.earlier.played + this.last.played,
        missed: this.earlier.missed + this.last.missed,
        buffered: delay * this.audio.context.sampleRate,
        level: s.audioLevel || 0,
      };
    }
  }

  _serverEnded() {
    this._close();
    const reason = this.serverError ? ` ${this.serverError}` : "";
    this._end({ ok: !this.serverError, text: `The conversation ended.${reason}` });
  }

  _fallBack(why) {
    this._hangUp();
    this.audio.stopStream();
    this.state = { phase: "ended" }; // (quietly: the WebSocket conversation takes over the page and the audio)
    this.onFallback(why);
  }

  _hangUp() {
    const pc = this.pc;
    this.pc = null;
    if (!this.location) {
      if (pc) pc.close();
      return;
    }
    const hangup = fetch(new URL(`${this.location}/hangup`, this.pageUrl), { method: "POST", keepalive: true });
    hangup.catch(() => {}).finally(() => pc && pc.close()); // (closed after, so the server logs a hang-up)
  }

  // The current peer connection's counters, added to the earlier ones before it is replaced.
  _keepCounters() {
    clearInterval(this._stats);
    if (this.last) {
      this.earlier.played += this.last.played;
      this.earlier.missed += this.last.missed;
      this.last = null;
    }
  }

  _close() {
    this._keepCounters();
    const pc = this.pc;
    this.pc = null;
    if (pc) pc.close();
  }

  _end(ending) {
    if (this.state.phase === "ended") return;
    clearInterval(this._stats);
    this.audioClosed = this.audio.close(); // resolves once the recording has its last samples
    this._setState({ phase: "ended", ending });
  }

  _setState(state) {
    this.state = state;
    this.onState(state);
  }
}

// The words of an OpenAI error body, for the person.
async function refusal(response) {
  try {
    const body = await response.json();
    return `The server refused the call: ${body.error.message}`;
  } catch {
    return `The server refused the call (HTTP ${response.status}).`;
  }
}
