// The Moshi wire protocol of /api/chat, as pure functions (see PROTOCOL.md).
//
// Every message is one binary WebSocket frame: a kind byte, then the payload.
// This module knows nothing of sockets or audio: bytes in, plain objects out.

export const Kind = Object.freeze({
  HANDSHAKE: 0x00, // server: the conversation is ready
  AUDIO: 0x01, // both ways: Ogg Opus pages, 24 kHz mono
  TEXT: 0x02, // server: a piece of the model's inner monologue (UTF-8)
  CONTROL: 0x03, // client: unused by PersonaPlex
  METADATA: 0x04, // server: JSON (optional)
  ERROR: 0x05, // server: UTF-8 message, sent just before it closes the socket
  PING: 0x06, // server: keep-alive while queued or preparing
  CALLER_TEXT: 0x10, // server, pplex-trio's own: a piece of the caller's words (UTF-8), when asked (transcribe_caller=1)
  RESUME: 0x11, // server, pplex-trio's own, when asked (resumable=1): JSON {token, resumed?, notice?} after the handshake
  HANGUP: 0x12, // client, pplex-trio's own: the person ended the call; don't hold it for a resume
});

const utf8 = new TextDecoder("utf-8");

/** The message that carries one or more whole Ogg pages to the server. */
export function encodeAudio(ogg) {
  const message = new Uint8Array(1 + ogg.length);
  message[0] = Kind.AUDIO;
  message.set(ogg, 1);
  return message;
}

/** The message that ends the call for good before the socket closes (a resumable call is otherwise held). */
export function encodeHangup() {
  return new Uint8Array([Kind.HANGUP]);
}

/** Decode one server message (ArrayBuffer or Uint8Array) into {type, ...}. */
export function decodeMessage(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  if (bytes.length === 0) return { type: "invalid", reason: "empty message" };
  const payload = bytes.subarray(1);
  switch (bytes[0]) {
    case Kind.HANDSHAKE:
      return { type: "handshake" };
    case Kind.AUDIO:
      return { type: "audio", ogg: payload };
    case Kind.TEXT:
      return { type: "text", text: utf8.decode(payload) };
    case Kind.CALLER_TEXT:
      return { type: "caller_text", text: utf8.decode(payload) };
    case Kind.METADATA:
      try {
        return { type: "metadata", metadata: JSON.parse(utf8.decode(payload)) };
      } catch {
        return { type: "invalid", reason: "metadata is not JSON" };
      }
    case Kind.ERROR:
      return { type: "error", message: utf8.decode(payload) };
    case Kind.PING:
      return { type: "ping" };
    case Kind.RESUME:
      return decodeResume(payload);
    default:
      // Ignore what we do not know, as the protocol asks of both sides.
      return { type: "unknown", kind: bytes[0] };
  }
}

// 0x11: the token that resumes this call after a dropped connection (each resume gives a new one).
function decodeResume(payload) {
  let offer;
  try {
    offer = JSON.parse(utf8.decode(payload));
  } catch {
    return { type: "invalid", reason: "resume offer is not JSON" };
  }
  if (typeof offer !== "object" || offer === null || typeof offer.token !== "string" || offer.token === "") {
    return { type: "invalid", reason: "resume offer has no token" };
  }
  const message = { type: "resume", token: offer.token, resumed: offer.resumed === true };
  if (typeof offer.notice === "string") message.notice = offer.notice;
  return message;
}

/**
 * The /api/chat URL for a page served from `pageUrl`, with the settings as the
 * official client sends them (form-encoded query parameters).
 */
export function chatUrl(pageUrl, params) {
  const url = new URL("/api/chat", pageUrl);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, String(value));
  }
  return url.toString();
}

/**
 * Why a conversation ended, in words for the person using the page.
 * `serverMessage` is the text of a 0x05 error, when one came before the close.
 */
export function describeEnding(code, serverMessage) {
  const detail = serverMessage ? ` ${serverMessage}` : "";
  switch (code) {
    case 1000:
      return { ok: true, text: serverMessage || "The conversation ended." };
    case 1001:
      return { ok: false, text: "The server is shutting down. Try again in a moment." };
    case 1003:
    case 1007:
    case 1009:
      return { ok: false, text: `The server refused our data.${detail}` };
    case 1008:
      return { ok: false, text: `The server refused the settings.${detail}` };
    case 1011:
      return { ok: false, text: `The model failed during the conversation.${detail}` };
    case 1013:
      return { ok: false, text: `The server is busy: ${serverMessage || "all conversation slots are taken. Try again later."}` };
    case 1006:
      return { ok: false, text: "The connection was lost (is the server running?)." };
    default:
      return { ok: false, text: `The connection closed (code ${code}).${detail}` };
  }
}
