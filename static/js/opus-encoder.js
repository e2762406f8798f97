// Microphone PCM → Ogg Opus pages, the way the official client sends them:
// mono Opus in 20 ms packets, at most two packets per Ogg page, the OpusHead
// and OpusTags header pages first.  Opus packets do not depend on a sample
// rate: the server decodes them at 24 kHz whatever rate we encode from
// (OpusHead's "input sample rate" only records ours, as the official client's does).
//
// The Opus encoding itself is the browser's (WebCodecs AudioEncoder, which is
// libopus inside Chromium and Firefox); this module only feeds it and wraps
// its packets in Ogg pages (ogg.js).

import { OggPageWriter, opusHead, opusTags, parseOpusHead } from "./ogg.js";

export const PACKET_MS = 20;
export const PACKETS_PER_PAGE = 2;
const OPUS_RATE = 48000; // Ogg Opus granule positions always count 48 kHz samples
const DEFAULT_PRE_SKIP = 312; // libopus's look-ahead at 48 kHz, if the encoder does not say

export function opusEncodingSupported(sampleRate) {
  if (typeof AudioEncoder === "undefined") return Promise.resolve(false);
  return AudioEncoder.isConfigSupported(encoderConfig(sampleRate, 32000)).then(
    (r) => r.supported,
    () => false,
  );
}

function encoderConfig(sampleRate, bitrate) {
  return {
    codec: "opus",
    sampleRate,
    numberOfChannels: 1,
    bitrate,
    opus: { frameDuration: PACKET_MS * 1000, format: "opus" }, // bare packets; we add the Ogg layer
  };
}

export class OggOpusEncoder {
  /**
   * @param {object} o
   * @param {number} o.sampleRate  rate of the PCM given to encode()
   * @param {(page: Uint8Array) => void} o.onPage  called with each Ogg page, headers first
   * @param {(error: Error) => void} o.onError
   */
  constructor({ sampleRate, onPage, onError, bitrate = 32000 }) {
    this.sampleRate = sampleRate;
    this.onPage = onPage;
    this.pages = new OggPageWriter();
    this.pending = []; // packets waiting to fill a page
    this.granule = 0;
    this.samplesIn = 0;
    this.headersSent = false;
    this.encoder = new AudioEncoder({
      output: (chunk, meta) => this._packet(chunk, meta),
      error: (e) => onError(e),
    });
    this.encoder.configure(encoderConfig(sampleRate, bitrate));
  }

  /** Queue mono float PCM (any length) for encoding. */
  encode(pcm) {
    if (this.encoder.state !== "configured") return;
    const audio = new AudioData({
      format: "f32",
      sampleRate: this.sampleRate,
      numberOfFrames: pcm.length,
      numberOfChannels: 1,
      timestamp: Math.round((this.samplesIn * 1e6) / this.sampleRate),
      data: pcm,
    });
    this.samplesIn += pcm.length;
    this.encoder.encode(audio);
    audio.close();
  }

  close() {
    if (this.encoder.state !== "closed") this.encoder.close();
  }

  _packet(chunk, meta) {
    if (!this.headersSent) this._sendHeaders(meta);
    const packet = new Uint8Array(chunk.byteLength);
    chunk.copyTo(packet);
    const duration = chunk.duration || PACKET_MS * 1000; // microseconds
    this.granule += Math.round((duration * OPUS_RATE) / 1e6);
    this.pending.push(packet);
    if (this.pending.length === PACKETS_PER_PAGE) {
      this.onPage(this.pages.page(this.pending, this.granule));
      this.pending = [];
    }
  }

  _sendHeaders(meta) {
    // The encoder's own OpusHead (when it gives one) tells its real pre-skip.
    let preSkip = DEFAULT_PRE_SKIP;
    const description = meta && meta.decoderConfig && meta.decoderConfig.description;
    if (description) {
      const bytes = ArrayBuffer.isView(description)
        ? new Uint8Array(description.buffer, description.byteOffset, description.byteLength)
        : new Uint8Array(description);
      const head = parseOpusHead(bytes);
      if (head) preSkip = head.preSkip;
    }
    this.onPage(this.pages.page([opusHead({ channels: 1, preSkip, inputSampleRate: this.sampleRate })], 0));
    this.onPage(this.pages.page([opusTags()], 0));
    this.granule = preSkip;
    this.headersSent = true;
  }
}
