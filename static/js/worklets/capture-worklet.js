// AudioWorklet: collects microphone audio into fixed blocks for the Opus encoder.
//
// Runs on the audio thread at the AudioContext's rate (48 kHz in this app,
// which the Opus encoder takes as it is).  Each block of `blockSize` mono samples goes to the main
// thread with its RMS level, for the encoder and the level meter.

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.blockSize = options.processorOptions.blockSize;
    this.block = new Float32Array(this.blockSize);
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    const frames = channels.length ? channels[0].length : 128;
    for (let i = 0; i < frames; i++) {
      // Mix to mono (a muted or ended track gives no channels: silence).
      let sample = 0;
      for (const channel of channels) sample += channel[i];
      this.block[this.filled++] = channels.length ? sample / channels.length : 0;
      if (this.filled === this.blockSize) {
        let energy = 0;
        for (const s of this.block) energy += s * s;
        const pcm = this.block;
        this.port.postMessage({ pcm, rms: Math.sqrt(energy / pcm.length) }, [pcm.buffer]);
        this.block = new Float32Array(this.blockSize);
        this.filled = 0;
      }
    }
    return true; // keep running while the page holds the node
  }
}

registerProcessor("capture-processor", CaptureProcessor);
