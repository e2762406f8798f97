// When and how the page reconnects a dropped call, as pure functions (no sockets, no clocks).
//
// A call opened with resumable=1 gets a resume token (0x11) after its handshake.  If
// its socket then drops without a close code, the server holds the call for its resume
// window (--resume-seconds, 20 s by default) and the page reopens /api/chat?resume=TOKEN
// with backoff: 250 ms, doubling to 4 s, no attempt that would start after the window.

export const RECONNECT = Object.freeze({
  firstDelayMs: 250,
  maxDelayMs: 4000,
  windowMs: 20_000, // the server's default resume window
});

/** The wait before attempt `attempt` (1, 2, …). */
export function backoffDelay(attempt, policy = RECONNECT) {
  return Math.min(policy.firstDelayMs * 2 ** (attempt - 1), policy.maxDelayMs);
}

/**
 * How long to wait before attempt `attempt`, `elapsedMs` after the drop; null: give up
 * (that attempt would start after the window, when the server has ended the call).
 */
export function nextAttemptDelay(attempt, elapsedMs, policy = RECONNECT) {
  const delay = backoffDelay(attempt, policy);
  return elapsedMs + delay < policy.windowMs ? delay : null;
}

/**
 * Whether a socket that closed with `code` lost a call that can be resumed: only a
 * close without a code (1006: no close frame, a reset; 1005: a frame without a code).
 * A code, or a 0x05 error before it (`serverMessage`), is the server's own ending.
 */
export function isDrop(code, serverMessage) {
  return !serverMessage && (code === 1006 || code === 1005);
}

/** What the status says while reconnecting. */
export function reconnectingText(attempt) {
  return attempt > 1 ? `Reconnecting… (attempt ${attempt})` : "Reconnecting…";
}

/** The ending of a call that could not be resumed (`detail`: the server's refusal, if any). */
export function lostEnding(detail) {
  return { ok: false, text: `The call was lost: start a new one.${detail ? ` (${detail})` : ""}` };
}
