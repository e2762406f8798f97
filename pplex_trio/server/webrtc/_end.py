"""Why a WebRTC call's connection ended (the log's word and ``/metrics``' label)."""

from __future__ import annotations

import enum


class EndReason(enum.Enum):
    """Why a call's peer connection ended: ``pplex_webrtc_calls_ended_total``'s ``reason``."""

    SESSION = "session_ended"  # the session ended it (its outcome, in pplex_sessions_ended_total, says why)
    PEER_CLOSED = "peer_closed"  # the caller closed the connection or its events channel
    HANGUP = "hangup"  # the hang-up route
    ICE_FAILED = "ice_failed"  # no network path to the caller was found (before its checks or the session gave up)
    DTLS_FAILED = "dtls_failed"  # a path was found, the DTLS handshake failed (or never finished)
    CONSENT_EXPIRED = "consent_expired"  # the path worked, then the caller stopped answering (RFC 7675): gone
    SHUTDOWN = "shutdown"  # the server stopped with the call still up
