// AudioWorklet: the model's voice, through a small jitter buffer.
//
// The server sends 80 ms of audio per tick; the network delivers it in bursts.
// This processor holds decoded samples and plays them at the audio clock:
//
// - It starts (and restarts after running dry) only once `startSamples` are
//   buffered (~90 ms), so ordinary jitter does not cut the voice.
// - On underrun it fades the last samples out instead of cutting them (no
//   click), plays silence, and counts the silence as *missed* audio.
// - On overflow (more than `maxSamples` waiting: a burst after a stall, or
//   clock drift) it drops the oldest audio down to `startSamples`: staying
//   close to real time matters more than playing every sample late.
//
// It reports played / missed / dropped audio, the buffer and the output level.

class PlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { startSamples, maxSamples, fadeSamples, statsEvery } = options.processorOptions;
    this.startSamples = startSamples;
    this.maxSamples = maxSamples;
    this.fadeSamples = fadeSamples;
    this.statsEvery = statsEvery;
    this.reset();
    this.port.onmessage = ({ data }) => {
      if (data.type === "pcm") this.push(data.pcm);
      else if (data.type === "reset") this.reset();
      else if (data.type === "end") this.active = false; // conversation over: silence is not "missed"
    };
  }

  reset() {
    this.queue = []; // Float32Array chunks, oldest first
    this.readOffset = 0; // samples of queue[0] already played
    this.buffered = 0;
    this.playing = false; // false while (re)filling up to startSamples
    this.fadeIn = 0; // samples left in the fade-in after a (re)start
    this.active = true;
    this.started = false; // anything played yet: before that, silence is expected
    this.played = 0;
    this.missed = 0;
    this.dropped = 0;
    this.underruns = 0;
    this.energy = 0;
    this.sinceStats = 0;
  }

  push(pcm) {
    this.queue.push(pcm);
    this.buffered += pcm.length;
    if (this.buffered > this.maxSamples) this.drop(this.buffered - this.startSamples);
  }

  drop(count) {
    this.dropped += count;
    this.buffered -= count;
    while (count > 0) {
      const head = this.queue[0];
      const left = head.length - this.readOffset;
      if (left <= count) {
        count -= left;
        this.queue.shift();
        this.readOffset = 0;
      } else {
        this.readOffset += count;
        count = 0;
      }
    }
  }

  // Copy `n` buffered samples into out[from..], oldest first.
  take(out, from, n) {
    let written = 0;
    while (written < n) {
      const head = this.queue[0];
      const count = Math.min(n - written, head.length - this.readOffset);
      out.set(head.subarray(this.readOffset, this.readOffset + count), from + written);
      written += count;
      this.readOffset += count;
      if (this.readOffset === head.length) {
        this.queue.shift();
        this.readOffset = 0;
      }
    }
    this.buffered -= n;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    const n = out.length;
    out.fill(0);
    if (!this.playing && this.buffered >= this.startSamples) {
      this.playing = true;
      this.started = true;
      this.fadeIn = this.fadeSamples;
    }
    if (this.playing) {
      const available = Math.min(n, this.buffered);
      this.take(out, 0, available);
      for (let i = 0; i < available && this.fadeIn > 0; i++, this.fadeIn--) {
        out[i] *= 1 - this.fadeIn / this.fadeSamples;
      }
      this.played += available;
      if (available < n) {
        // Ran dry: fade out what we had, then wait for the buffer to refill.
        const fade = Math.min(available, this.fadeSamples);
        for (let i = 0; i < fade; i++) out[available - fade + i] *= 1 - (i + 1) / fade;
        this.playing = false;
        this.underruns += 1;
        if (this.active) this.missed += n - available;
      }
    } else if (this.started && this.active) {
      this.missed += n;
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    for (let i = 0; i < n; i++) this.energy += out[i] * out[i];
    this.sinceStats += n;
    if (this.sinceStats >= this.statsEvery) this.report();
    return true;
  }

  report() {
    this.port.postMessage({
      type: "stats",
      played: this.played,
      missed: this.missed,
      dropped: this.dropped,
      underruns: this.underruns,
      buffered: this.buffered,
      level: Math.sqrt(this.energy / this.sinceStats),
    });
    this.energy = 0;
    this.sinceStats = 0;
  }
}

registerProcessor("player-processor", PlayerProcessor);
