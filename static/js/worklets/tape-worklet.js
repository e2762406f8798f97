// AudioWorklet: the conversation recorder.
//
// Input 0 is what the speaker plays (the model), input 1 the microphone.
// Both arrive in the same render quantum, so the two channels of the
// recording line up sample for sample, as the person heard and spoke them.

const CHUNK = 4096; // samples per message to the main thread

class TapeProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.recording = false;
    this.left = new Float32Array(CHUNK);
    this.right = new Float32Array(CHUNK);
    this.filled = 0;
    this.port.onmessage = ({ data }) => {
      if (data.type === "start") this.recording = true;
      if (data.type === "stop") {
        this.recording = false;
        this.flush();
        this.port.postMessage({ type: "stopped" });
      }
    };
  }

  flush() {
    if (this.filled === 0) return;
    const left = this.left.slice(0, this.filled);
    const right = this.right.slice(0, this.filled);
    this.port.postMessage({ type: "chunk", left, right }, [left.buffer, right.buffer]);
    this.filled = 0;
  }

  process(inputs) {
    if (!this.recording) return true;
    const model = inputs[0];
    const mic = inputs[1];
    const frames = (model[0] || mic[0] || { length: 128 }).length;
    for (let i = 0; i < frames; i++) {
      this.left[this.filled] = mono(model, i);
      this.right[this.filled] = mono(mic, i);
      this.filled += 1;
      if (this.filled === CHUNK) this.flush();
    }
    return true;
  }
}

// Sample i of an input mixed to mono; an unconnected input (no channels) is silence.
function mono(channels, i) {
  if (!channels.length) return 0;
  let sum = 0;
  for (const channel of channels) sum += channel[i];
  return sum / channels.length;
}

registerProcessor("tape-processor", TapeProcessor);
