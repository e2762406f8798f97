// The page: settings form, Connect/Disconnect, state, meters, transcript,
// stats and the recording.  Everything audio or network lives in session.js.

import { opusEncodingSupported } from "./opus-encoder.js";
import { PRESETS, voiceLabel } from "./presets.js";
import { AudioGraph, SAMPLE_RATE } from "./audio-graph.js";
import { reconnectingText } from "./reconnect.js";
import { Conversation } from "./session.js";
import { WebRtcConversation, realtimeSession, webRtcAvailable } from "./webrtc.js";
import { setupYourVoice } from "./your-voice.js";

const $ = (id) => document.getElementById(id);
const els = {
  serverInfo: $("server-info"),
  settings: $("settings"),
  presets: $("presets"),
  persona: $("persona"),
  personaCount: $("persona-count"),
  personaError: $("persona-error"),
  voice: $("voice"),
  textTemperature: $("text-temperature"),
  textTopk: $("text-topk"),
  audioTemperature: $("audio-temperature"),
  audioTopk: $("audio-topk"),
  seed: $("seed"),
  webRtcSettings: $("webrtc-settings"),
  voiceProcessing: $("voice-processing"),
  state: $("state"),
  transport: $("transport"),
  stateText: $("state-text"),
  ending: $("ending"),
  connect: $("connect"),
  micMeter: $("mic-meter"),
  modelMeter: $("model-meter"),
  transcript: $("transcript"),
  played: $("stat-played"),
  missed: $("stat-missed"),
  latency: $("stat-latency"),
  buffer: $("stat-buffer"),
  download: $("download"),
  locked: $("locked"),
  officialLink: $("official-link"),
};

let maxPromptChars = 1000;
let transcribesCaller = false; // the server transcribes the caller (--transcribe): the page asks for both sides
let yourVoice = null; // the "Your voice" panel
let conversation = null; // the current (or last) Conversation
let browserProblem = null; // why this browser cannot talk, if it cannot
// Why the WebSocket cannot carry a conversation in this browser (no WebCodecs Opus), null if it can, once
// webCodecsKnown resolves.  WebRTC needs none of it (the browser's own Opus), so it does not wait for it.
let webSocketProblem = null;
let webCodecsKnown = Promise.resolve();

// -- settings -----------------------------------------------------------------

function setupPresets() {
  for (const preset of PRESETS) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "chip";
    button.textContent = preset.label;
    button.addEventListener("click", () => {
      els.persona.value = preset.text;
      updateCounter();
      for (const chip of els.presets.children) chip.setAttribute("aria-pressed", String(chip === button));
    });
    button.setAttribute("aria-pressed", "false");
    els.presets.append(button);
  }
  els.presets.children[0].click();
}

function updateCounter() {
  const n = els.persona.value.length;
  els.personaCount.textContent = `${n} / ${maxPromptChars}`;
  const over = n > maxPromptChars;
  els.personaCount.classList.toggle("over", over);
  els.persona.setAttribute("aria-invalid", String(over));
  els.personaError.textContent = over ? `Too long by ${n - maxPromptChars} characters.` : "";
  updateConnectButton();
}

function readSettings() {
  const number = (input) => (input.value.trim() === "" ? undefined : input.value.trim());
  // One seed for both streams when given; otherwise fresh random seeds, like the official client.
  const seed = number(els.seed);
  const random = () => Math.floor(Math.random() * 1_000_000);
  return {
    text_temperature: number(els.textTemperature),
    text_topk: number(els.textTopk),
    audio_temperature: number(els.audioTemperature),
    audio_topk: number(els.audioTopk),
    text_seed: seed ?? random(),
    audio_seed: seed ?? random(),
    text_prompt: els.persona.value.trim(),
    voice_prompt: els.voice.value,
    transcribe_caller: transcribesCaller ? 1 : undefined,
  };
}

async function loadServerInfo() {
  try {
    const [info, voices] = await Promise.all([getJson("/api/info"), getJson("/api/voices")]);
    maxPromptChars = info.max_prompt_chars;
    transcribesCaller = Boolean(info.transcribes_caller);
    els.persona.maxLength = maxPromptChars;
    els.officialLink.hidden = !info.official_client;
    els.serverInfo.textContent = `Model: ${info.model} · ${info.slots} conversation slot${info.slots === 1 ? "" : "s"}`;
    showVoices(voices);
    updateCounter();
  } catch (e) {
    els.serverInfo.textContent = `Cannot reach the server (${e.message}). Reload the page to try again.`;
    els.serverInfo.classList.add("problem");
  }
}

function showVoices(voices, selected = els.voice.value) {
  const added = new Set(voices.added || []);
  els.voice.replaceChildren(
    ...voices.voices.map((file) => new Option(added.has(file) ? `${voiceLabel(file)} (added)` : voiceLabel(file), file)),
  );
  if (!voices.voices.length) els.voice.replaceChildren(new Option("Default voice", ""));
  if (voices.voices.includes(selected)) els.voice.value = selected;
  yourVoice.enable(Boolean(voices.uploads));
}

async function voiceAdded(file) {
  showVoices(await getJson("/api/voices"), file);
}

async function getJson(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

// -- the conversation ---------------------------------------------------------

const PHASE_TEXT = {
  idle: () => "Ready",
  connecting: () => "Connecting…",
  queued: (s) => (s.position ? `Queued (position ${s.position})` : "Queued"),
  preparing: () => "Preparing the persona…",
  live: () => "Live",
  reconnecting: (s) => reconnectingText(s.attempt),
  ended: () => "Ended",
};

function render(state) {
  els.state.dataset.phase = state.phase;
  els.stateText.textContent = PHASE_TEXT[state.phase](state);
  const active = state.phase !== "idle" && state.phase !== "ended";
  els.settings.disabled = active;
  els.locked.hidden = !active;
  document.body.classList.toggle("active", active);
  els.connect.textContent = active ? "Disconnect" : "Connect";
  els.connect.classList.toggle("danger", active);
  els.ending.hidden = state.phase !== "ended";
  if (state.phase === "ended") {
    els.ending.textContent = state.ending.text;
    els.ending.classList.toggle("problem", !state.ending.ok);
  }
  if (state.phase === "live" && !state.resumed) els.transcript.replaceChildren(); // a resumed call goes on
  els.transport.hidden = !["live", "reconnecting"].includes(state.phase);
  const why = conversation.fallback ? ` (fallback: ${conversation.fallback})` : "";
  els.transport.textContent = `Connected over ${conversation.transport}${why}`;
  updateConnectButton();
}

function updateConnectButton() {
  const active = conversation && !["idle", "ended"].includes(conversation.state.phase);
  els.connect.disabled = !active && (browserProblem !== null || els.persona.value.length > maxPromptChars);
}

function connect() {
  els.transcript.replaceChildren(placeholder("Waiting for the model…"));
  els.download.disabled = true;
  const params = readSettings();
  const options = {
    pageUrl: location.href,
    voiceProcessing: els.voiceProcessing.checked,
    onState: render,
    onText: appendText,
    audio: new AudioGraph(), // now, inside the click
  };
  const why = webSocketReason();
  if (why) {
    overWebSocket(options, params, why);
    return;
  }
  const onFallback = (reason) => webCodecsKnown.then(() => overWebSocket(options, params, reason));
  conversation = new WebRtcConversation({ ...options, session: realtimeSession(params), onFallback });
  conversation.start();
}

const askedForWebSocket = () => new URLSearchParams(location.search).get("transport") === "websocket";

// Why this conversation goes over the WebSocket (null: over WebRTC).
function webSocketReason() {
  if (askedForWebSocket()) return "asked for with ?transport=websocket";
  if (!webRtcAvailable()) return "this browser has no WebRTC";
  return null;
}

function overWebSocket(options, params, why) {
  if (webSocketProblem) {
    // (only after WebRTC fell through: where the WebSocket is the plan, Connect waits for WebCodecs)
    options.audio.close();
    render({ phase: "ended", ending: { ok: false, text: `WebRTC could not be used (${why}). ${webSocketProblem}` } });
    return;
  }
  conversation = new Conversation({ ...options, params });
  conversation.fallback = why;
  conversation.start();
}

// Why this browser cannot encode and decode Opus itself (WebCodecs), which the WebSocket needs; null if it can.
async function webCodecsProblem() {
  if ((await opusEncodingSupported(SAMPLE_RATE)) && typeof AudioDecoder !== "undefined") return null;
  const instead = askedForWebSocket() && webRtcAvailable() ? " (WebRTC, without ?transport=websocket, does not)" : "";
  const problem = `This browser cannot encode Opus audio (WebCodecs), which the WebSocket needs${instead}.`;
  return `${problem} Use a recent Chrome, Edge or Firefox.`;
}

function appendText(text, speaker = "agent") {
  const atBottom = els.transcript.scrollHeight - els.transcript.scrollTop - els.transcript.clientHeight < 24;
  if (!transcribesCaller) {
    // The server supplies the spacing; only the very first leading space is dropped.
    els.transcript.append(els.transcript.childNodes.length ? text : text.trimStart());
  } else {
    // Both sides: a marked line per speaker, a new one whenever the speaker changes.
    let line = els.transcript.lastElementChild;
    if (!line || line.dataset.speaker !== speaker) {
      line = document.createElement("div");
      line.dataset.speaker = speaker;
      const mark = document.createElement("b");
      mark.textContent = speaker === "caller" ? "You: " : "Model: ";
      line.append(mark);
      els.transcript.append(line);
      text = text.trimStart();
    }
    line.append(text);
  }
  if (atBottom) els.transcript.scrollTop = els.transcript.scrollHeight;
}

function placeholder(text) {
  const span = document.createElement("span");
  span.className = "placeholder";
  span.textContent = text;
  return span;
}

async function downloadRecording() {
  if (!conversation) return;
  if (conversation.audioClosed) await conversation.audioClosed;
  const url = URL.createObjectURL(conversation.audio.recording.toBlob());
  const link = document.createElement("a");
  link.href = url;
  link.download = `personaplex-${new Date().toISOString().replace(/[:.]/g, "-")}.wav`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// -- meters and stats, once per animation frame -------------------------------

function levelPercent(rms) {
  // -60 dBFS … 0 dBFS onto 0 … 100 %.
  const db = 20 * Math.log10(Math.max(rms, 1e-6));
  return Math.max(0, Math.min(100, ((db + 60) / 60) * 100));
}

function setMeter(fill, rms) {
  const percent = levelPercent(rms);
  fill.style.transform = `scaleX(${percent / 100})`;
  fill.parentElement.setAttribute("aria-valuenow", String(Math.round(percent)));
}

function setStat(element, value, text) {
  element.dataset.value = String(value);
  element.textContent = text;
}

function tick() {
  const live = conversation && conversation.state.phase !== "idle";
  if (live) {
    const audio = conversation.audio;
    const ended = conversation.state.phase === "ended";
    setMeter(els.micMeter, ended ? 0 : audio.micLevel);
    setMeter(els.modelMeter, ended ? 0 : audio.playerStats.level);
    const stats = audio.playerStats;
    setStat(els.played, stats.played / SAMPLE_RATE, `${(stats.played / SAMPLE_RATE).toFixed(1)} s`);
    setStat(els.missed, stats.missed / SAMPLE_RATE, `${(stats.missed / SAMPLE_RATE).toFixed(2)} s`);
    if (!ended && stats.played > 0) {
      const latency = audio.latency();
      setStat(els.latency, latency, `${Math.round(latency * 1000)} ms`);
      setStat(els.buffer, stats.buffered / SAMPLE_RATE, `${Math.round((stats.buffered / SAMPLE_RATE) * 1000)} ms`);
    }
    els.download.disabled = audio.recording.frames === 0;
  }
  requestAnimationFrame(tick);
}

// -- start ----------------------------------------------------------------------

async function main() {
  setupPresets();
  yourVoice = setupYourVoice({ onAdded: voiceAdded });
  els.persona.addEventListener("input", updateCounter);
  els.connect.addEventListener("click", () => {
    const active = conversation && !["idle", "ended"].includes(conversation.state.phase);
    if (active) conversation.stop();
    else connect();
  });
  els.download.addEventListener("click", downloadRecording);
  if (!window.isSecureContext) {
    browserProblem = "This page must be opened over https:// (or on localhost) to use the microphone.";
  } else {
    webCodecsKnown = webCodecsProblem().then((problem) => (webSocketProblem = problem));
    if (webSocketReason()) {
      await webCodecsKnown;
      browserProblem = webSocketProblem;
    }
  }
  els.webRtcSettings.hidden = webSocketReason() !== null;
  if (browserProblem) {
    els.ending.hidden = false;
    els.ending.textContent = browserProblem;
    els.ending.classList.add("problem");
  }
  await loadServerInfo();
  updateConnectButton();
  requestAnimationFrame(tick);
}

main();
