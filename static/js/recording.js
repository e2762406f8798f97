// The conversation recording: stereo, the model on the left, the microphone on
// the right, as 16-bit PCM WAV.

export class Recording {
  constructor(sampleRate) {
    this.sampleRate = sampleRate;
    this.left = [];
    this.right = [];
    this.frames = 0;
  }

  add(left, right) {
    this.left.push(left);
    this.right.push(right);
    this.frames += left.length;
  }

  get seconds() {
    return this.frames / this.sampleRate;
  }

  toBlob() {
    return new Blob([encodeWav([join(this.left, this.frames), join(this.right, this.frames)], this.sampleRate)], {
      type: "audio/wav",
    });
  }
}

function join(chunks, frames) {
  const out = new Float32Array(frames);
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.length;
  }
  return out;
}

/** Interleave float channels (-1..1) into a 16-bit PCM WAV file. */
export function encodeWav(channels, sampleRate) {
  const frames = channels[0].length;
  const n = channels.length;
  const dataBytes = frames * n * 2;
  const buffer = new ArrayBuffer(44 + dataBytes);
  const view = new DataView(buffer);
  const ascii = (offset, text) => [...text].forEach((ch, i) => view.setUint8(offset + i, ch.charCodeAt(0)));
  ascii(0, "RIFF");
  view.setUint32(4, 36 + dataBytes, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true); // fmt chunk size
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, n, true);
  view.setUint32(24, sampleRate, true);
  view.setUint32(28, sampleRate * n * 2, true); // bytes per second
  view.setUint16(32, n * 2, true); // bytes per frame
  view.setUint16(34, 16, true); // bits per sample
  ascii(36, "data");
  view.setUint32(40, dataBytes, true);
  let offset = 44;
  for (let i = 0; i < frames; i++) {
    for (let c = 0; c < n; c++) {
      const s = Math.max(-1, Math.min(1, channels[c][i]));
      view.setInt16(offset, s < 0 ? s * 0x8000 : s * 0x7fff, true);
      offset += 2;
    }
  }
  return buffer;
}
