// Server Ogg Opus pages → mono float PCM at the player's rate.
//
// The pages are split into Opus packets (ogg.js); the browser decodes them
// (WebCodecs AudioDecoder).  A BOS page (a new OpusHead) starts a new stream,
// as the official client does.  Audio before any OpusHead cannot be decoded
// and is counted, not fatal.

import { OggPacketReader, startsWith } from "./ogg.js";

export class OggOpusDecoder {
  /**
   * @param {object} o
   * @param {number} o.sampleRate  rate wanted for the output PCM
   * @param {(pcm: Float32Array) => void} o.onPcm
   * @param {(error: Error) => void} o.onError
   */
  constructor({ sampleRate, onPcm, onError }) {
    this.sampleRate = sampleRate;
    this.onPcm = onPcm;
    this.onError = onError;
    this.reader = new OggPacketReader();
    this.decoder = null;
    this.timestamp = 0;
    this.packets = 0;
    this.undecodable = 0; // packets that came before any header
  }

  /** Feed the bytes of one or more Ogg pages (any split). */
  push(bytes) {
    for (const { data } of this.reader.push(bytes)) {
      if (startsWith(data, "OpusHead")) {
        this._start(data);
      } else if (startsWith(data, "OpusTags")) {
        // comments: nothing to play
      } else if (this.decoder && this.decoder.state === "configured") {
        this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: this.timestamp, data }));
        this.timestamp += 20000;
        this.packets += 1;
      } else {
        this.undecodable += 1;
      }
    }
  }

  close() {
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    this.decoder = null;
  }

  _start(head) {
    this.close();
    this.decoder = new AudioDecoder({
      output: (audio) => this._output(audio),
      error: (e) => this.onError(e),
    });
    this.decoder.configure({ codec: "opus", sampleRate: this.sampleRate, numberOfChannels: 1, description: head });
  }

  _output(audio) {
    const pcm = new Float32Array(audio.numberOfFrames);
    audio.copyTo(pcm, { planeIndex: 0, format: "f32-planar" });
    const rate = audio.sampleRate;
    audio.close();
    this.onPcm(rate === this.sampleRate ? pcm : resampleLinear(pcm, rate, this.sampleRate));
  }
}

/** Plain linear interpolation: only used if a browser's decoder gives another rate than we play at. */
export function resampleLinear(pcm, fromRate, toRate) {
  const out = new Float32Array(Math.round((pcm.length * toRate) / fromRate));
  const step = fromRate / toRate;
  for (let i = 0; i < out.length; i++) {
    const x = i * step;
    const j = Math.floor(x);
    const frac = x - j;
    out[i] = (pcm[j] ?? 0) * (1 - frac) + (pcm[j + 1] ?? pcm[j] ?? 0) * frac;
  }
  return out;
}
