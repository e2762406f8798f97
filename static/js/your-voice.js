// "Your voice": record a clip with the microphone (a countdown, then a level
// meter) or choose a file, hear it back, name it, and add it to the server
// (POST /api/voices), which makes a voice of it that conversations can pick.

import { encodeWav } from "./recording.js";

const COUNTDOWN = 3; // seconds before recording starts
const MAX_SECONDS = 10; // the recording stops by itself after this
const NAME = /^[A-Za-z0-9_-]{1,48}$/;
const TYPES = { wav: "audio/wav", flac: "audio/flac", mp3: "audio/mpeg", ogg: "audio/ogg" };
const workletUrl = new URL("./worklets/capture-worklet.js", import.meta.url);

const $ = (id) => document.getElementById(id);

/** Record from the microphone until stop() (or MAX_SECONDS); resolves to a mono WAV Blob. */
class ClipRecorder {
  /** Create it inside a click handler, before any await: browsers only let a page start audio then. */
  constructor(onLevel) {
    this.onLevel = onLevel;
    this.chunks = [];
    this.samples = 0;
    this.context = new AudioContext();
  }

  async start() {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw new Error("Recording needs microphone access, which browsers only give to https:// pages or localhost.");
    }
    try {
      // No voice processing: the clip should sound like the voice, not like a phone call.
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
      });
    } catch (e) {
      throw new Error(e.name === "NotAllowedError"
        ? "Microphone access was denied. Allow it in the browser's site settings, or choose a file instead."
        : `No microphone available (${e.name}), choose a file instead.`);
    }
    await this.context.resume();
    await this.context.audioWorklet.addModule(workletUrl);
    const source = this.context.createMediaStreamSource(this.stream);
    this.node = new AudioWorkletNode(this.context, "capture-processor", {
      channelCount: 1, channelCountMode: "explicit", processorOptions: { blockSize: 1024 },
    });
    this.node.port.onmessage = ({ data }) => {
      this.chunks.push(data.pcm);
      this.samples += data.pcm.length;
      this.onLevel(data.rms, this.samples / this.context.sampleRate);
      if (this.samples >= MAX_SECONDS * this.context.sampleRate) this.stop();
    };
    source.connect(this.node);
    this.node.connect(this.context.destination); // pulled through the graph; the worklet outputs silence
    this.done = new Promise((resolve) => (this.finish = resolve));
    return this.done;
  }

  stop() {
    if (!this.stream || this.stopped) return;
    this.stopped = true;
    for (const track of this.stream.getTracks()) track.stop();
    const rate = this.context.sampleRate;
    this.context.close();
    const pcm = new Float32Array(this.samples);
    let offset = 0;
    for (const chunk of this.chunks) {
      pcm.set(chunk, offset);
      offset += chunk.length;
    }
    this.finish(new Blob([encodeWav([pcm], rate)], { type: "audio/wav" }));
  }
}

/** The panel; ``onAdded(file)`` is called with the new voice's name (NAME.pt) once the server has it. */
export function setupYourVoice({ onAdded }) {
  const els = {
    panel: $("your-voice"), record: $("clip-record"), file: $("clip-file"), countdown: $("clip-countdown"),
    meter: $("clip-meter"), playback: $("clip-playback"), name: $("clip-name"), consent: $("clip-consent"),
    add: $("clip-add"), status: $("clip-status"),
  };
  let clip = null; // { blob, type }
  let recorder = null;

  const say = (text, problem = false) => {
    els.status.textContent = text;
    els.status.classList.toggle("problem", problem);
    els.status.setAttribute("role", problem ? "alert" : "status");
  };
  const update = () => {
    els.add.disabled = !(clip && NAME.test(els.name.value) && els.consent.checked);
    els.name.setAttribute("aria-invalid", String(els.name.value !== "" && !NAME.test(els.name.value)));
  };
  const useClip = (blob, type, label) => {
    clip = { blob, type };
    if (els.playback.src) URL.revokeObjectURL(els.playback.src);
    els.playback.src = URL.createObjectURL(blob);
    els.playback.hidden = false;
    say(`${label}: listen to it, name it, then add it.`);
    update();
  };
  const setLevel = (rms) => {
    const db = 20 * Math.log10(Math.max(rms, 1e-6));
    const percent = Math.max(0, Math.min(100, ((db + 60) / 60) * 100));
    els.meter.style.transform = `scaleX(${percent / 100})`;
    els.meter.parentElement.setAttribute("aria-valuenow", String(Math.round(percent)));
  };

  els.record.addEventListener("click", async () => {
    if (recorder) {
      recorder.stop();
      return;
    }
    els.record.disabled = true;
    recorder = new ClipRecorder((rms, seconds) => {
      setLevel(rms);
      els.countdown.textContent = `Recording… ${seconds.toFixed(1)} s (stops at ${MAX_SECONDS} s)`;
    });
    for (let n = COUNTDOWN; n > 0; n--) {
      els.countdown.textContent = `Recording in ${n}…`;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
    try {
      const done = recorder.start();
      els.record.disabled = false;
      els.record.textContent = "Stop";
      const blob = await done;
      useClip(blob, "audio/wav", `Recorded ${(recorder.samples / recorder.context.sampleRate).toFixed(1)} s`);
    } catch (e) {
      recorder.context.close();
      say(e.message, true);
    } finally {
      recorder = null;
      setLevel(0);
      els.countdown.textContent = "";
      els.record.disabled = false;
      els.record.textContent = "Record";
    }
  });

  els.file.addEventListener("change", () => {
    const file = els.file.files[0];
    if (!file) return;
    const type = TYPES[file.name.split(".").pop().toLowerCase()] || file.type;
    if (!Object.values(TYPES).includes(type)) {
      say(`${file.name} is not a WAV, FLAC, MP3 or Ogg file.`, true);
      return;
    }
    useClip(file, type, file.name);
  });

  els.name.addEventListener("input", update);
  els.consent.addEventListener("change", update);

  els.add.addEventListener("click", async () => {
    els.add.disabled = true;
    say("Making the voice…");
    try {
      const response = await fetch(`/api/voices?name=${encodeURIComponent(els.name.value)}`, {
        method: "POST", headers: { "Content-Type": clip.type }, body: clip.blob,
      });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(body.error || `the server answered ${response.status}`);
      say(`Added ${body.voice}: it is now picked in the voice list.`);
      await onAdded(body.voice);
    } catch (e) {
      say(`Not added: ${e.message}`, true);
    } finally {
      update();
    }
  });

  return {
    /** Show the panel only where the server takes voices. */
    enable(uploads) {
      els.panel.hidden = !uploads;
    },
  };
}
