// Ogg framing (RFC 3533) for Opus streams (RFC 7845): pages out, packets in.
//
// Pure functions and small classes, no browser APIs, so the same code runs in
// a page, a worker or a test.  The server speaks Ogg Opus because the official
// Moshi/PersonaPlex client does; WebCodecs hands us bare Opus packets, so this
// module adds and removes the Ogg layer.

const CAPTURE = [0x4f, 0x67, 0x67, 0x53]; // "OggS"
const HEADER_BYTES = 27; // fixed part of a page header, before the segment table
const FLAG_CONTINUED = 0x01;
const FLAG_BOS = 0x02;
const FLAG_EOS = 0x04;

// CRC-32 with Ogg's parameters: polynomial 0x04c11db7, no reflection, initial 0.
const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let r = i << 24;
    for (let bit = 0; bit < 8; bit++) r = r & 0x80000000 ? (r << 1) ^ 0x04c11db7 : r << 1;
    table[i] = r >>> 0;
  }
  return table;
})();

export function crc32(bytes) {
  let crc = 0;
  for (let i = 0; i < bytes.length; i++) crc = ((crc << 8) ^ CRC_TABLE[((crc >>> 24) ^ bytes[i]) & 0xff]) >>> 0;
  return crc >>> 0;
}

/** The OpusHead identification header (RFC 7845 §5.1), mono or stereo, mapping family 0. */
export function opusHead({ channels = 1, preSkip = 312, inputSampleRate = 48000 } = {}) {
  const head = new Uint8Array(19);
  const view = new DataView(head.buffer);
  head.set([0x4f, 0x70, 0x75, 0x73, 0x48, 0x65, 0x61, 0x64]); // "OpusHead"
  head[8] = 1; // version
  head[9] = channels;
  view.setUint16(10, preSkip, true);
  view.setUint32(12, inputSampleRate, true);
  view.setInt16(16, 0, true); // output gain
  head[18] = 0; // channel mapping family
  return head;
}

/** The OpusTags comment header (RFC 7845 §5.2) with a vendor string and no comments. */
export function opusTags(vendor = "pplex-trio web") {
  const vendorBytes = new TextEncoder().encode(vendor);
  const tags = new Uint8Array(8 + 4 + vendorBytes.length + 4);
  const view = new DataView(tags.buffer);
  tags.set([0x4f, 0x70, 0x75, 0x73, 0x54, 0x61, 0x67, 0x73]); // "OpusTags"
  view.setUint32(8, vendorBytes.length, true);
  tags.set(vendorBytes, 12);
  view.setUint32(12 + vendorBytes.length, 0, true); // no user comments
  return tags;
}

/** Pre-skip (in 48 kHz samples) from an OpusHead, or null if `head` is not one. */
export function parseOpusHead(head) {
  if (!startsWith(head, "OpusHead") || head.length < 19) return null;
  const view = new DataView(head.buffer, head.byteOffset, head.byteLength);
  return { channels: head[9], preSkip: view.getUint16(10, true), inputSampleRate: view.getUint32(12, true) };
}

export function startsWith(bytes, ascii) {
  if (bytes.length < ascii.length) return false;
  for (let i = 0; i < ascii.length; i++) if (bytes[i] !== ascii.charCodeAt(i)) return false;
  return true;
}

/**
 * Writes the pages of one logical stream: sequence numbers count up from 0
 * and the first page carries the BOS flag.
 */
export class OggPageWriter {
  constructor(serial = (Math.random() * 0x100000000) >>> 0) {
    this.serial = serial >>> 0;
    this.sequence = 0;
  }

  /** One page holding whole `packets` (Uint8Arrays); `granule` is the end position of the last one. */
  page(packets, granule, { eos = false } = {}) {
    const lacing = [];
    for (const packet of packets) {
      // A packet is a run of 255-byte segments ended by one shorter segment
      // (0 when its length is a multiple of 255).
      let left = packet.length;
      while (left >= 255) {
        lacing.push(255);
        left -= 255;
      }
      lacing.push(left);
    }
    if (lacing.length > 255) throw new Error(`${lacing.length} segments do not fit one Ogg page (255 at most)`);
    const bodyLength = packets.reduce((n, p) => n + p.length, 0);
    const page = new Uint8Array(HEADER_BYTES + lacing.length + bodyLength);
    const view = new DataView(page.buffer);
    page.set(CAPTURE, 0);
    page[4] = 0; // version
    page[5] = (this.sequence === 0 ? FLAG_BOS : 0) | (eos ? FLAG_EOS : 0);
    view.setBigInt64(6, BigInt(granule), true);
    view.setUint32(14, this.serial, true);
    view.setUint32(18, this.sequence, true);
    view.setUint32(22, 0, true); // CRC, computed below over the page with this field zeroed
    page[26] = lacing.length;
    page.set(lacing, HEADER_BYTES);
    let offset = HEADER_BYTES + lacing.length;
    for (const packet of packets) {
      page.set(packet, offset);
      offset += packet.length;
    }
    view.setUint32(22, crc32(page), true);
    this.sequence += 1;
    return page;
  }
}

/**
 * Reads Ogg pages from a byte stream split anywhere, and the packets in them
 * (a packet may continue over several pages).  Pages with a bad checksum
 * are skipped and counted: one damaged page must not stop the stream.
 */
export class OggPacketReader {
  constructor() {
    this._buffer = new Uint8Array(0);
    this._partial = []; // pieces of a packet that continues on the next page
    this.pages = 0;
    this.badPages = 0;
  }

  /** Feed bytes; returns the packets completed by them: {data, page: {sequence, bos, eos, granule}}. */
  push(bytes) {
    this._buffer = concat(this._buffer, bytes);
    const packets = [];
    for (;;) {
      const start = findCapture(this._buffer);
      if (start < 0) {
        // Keep a possible partial "OggS" at the end.
        this._buffer = this._buffer.slice(Math.max(0, this._buffer.length - 3));
        break;
      }
      const buf = this._buffer.subarray(start);
      if (buf.length < HEADER_BYTES) {
        this._buffer = buf.slice();
        break;
      }
      const segments = buf[26];
      const bodyStart = HEADER_BYTES + segments;
      if (buf.length < bodyStart) {
        this._buffer = buf.slice();
        break;
      }
      const lacing = buf.subarray(HEADER_BYTES, bodyStart);
      const pageLength = bodyStart + lacing.reduce((n, v) => n + v, 0);
      if (buf.length < pageLength) {
        this._buffer = buf.slice();
        break;
      }
      const page = buf.slice(0, pageLength);
      this._buffer = buf.slice(pageLength);
      if (!checksumOk(page)) {
        // Not a page after all (or damaged): resync after this capture pattern.
        this.badPages += 1;
        this._buffer = concat(page.subarray(4), this._buffer);
        this._partial = [];
        continue;
      }
      this.pages += 1;
      packets.push(...this._packetsOf(page, lacing, bodyStart));
    }
    return packets;
  }

  _packetsOf(page, lacing, bodyStart) {
    const view = new DataView(page.buffer, page.byteOffset, page.byteLength);
    const info = {
      sequence: view.getUint32(18, true),
      bos: Boolean(page[5] & FLAG_BOS),
      eos: Boolean(page[5] & FLAG_EOS),
      granule: view.getBigInt64(6, true),
    };
    const continued = Boolean(page[5] & FLAG_CONTINUED);
    if (!continued || info.bos) this._partial = []; // a packet that never finished: forget it
    // A continued page whose start we never saw begins with a fragment: skip it.
    let skipFirst = continued && this._partial.length === 0;
    const packets = [];
    let offset = bodyStart;
    let pieceStart = offset;
    for (const value of lacing) {
      offset += value;
      if (value < 255) {
        this._partial.push(page.subarray(pieceStart, offset));
        if (skipFirst) skipFirst = false;
        else packets.push({ data: concatAll(this._partial), page: info });
        this._partial = [];
        pieceStart = offset;
      }
    }
    if (pieceStart < offset) this._partial.push(page.slice(pieceStart, offset));
    return packets;
  }
}

function checksumOk(page) {
  const view = new DataView(page.buffer, page.byteOffset, page.byteLength);
  const stored = view.getUint32(22, true);
  const copy = page.slice();
  copy.fill(0, 22, 26);
  return crc32(copy) === stored;
}

function findCapture(buf) {
  for (let i = 0; i + 3 < buf.length; i++) {
    if (buf[i] === 0x4f && buf[i + 1] === 0x67 && buf[i + 2] === 0x67 && buf[i + 3] === 0x53) return i;
  }
  return -1;
}

function concat(a, b) {
  if (a.length === 0) return b instanceof Uint8Array ? b : new Uint8Array(b);
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

function concatAll(parts) {
  if (parts.length === 1) return parts[0].slice();
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}
