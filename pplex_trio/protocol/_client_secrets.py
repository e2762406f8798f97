"""Client secrets: short-lived, one-use keys a browser may hold instead of the server's token. Sans-IO.

``POST /v1/realtime/client_secrets`` (with the server's token) mints one, as
OpenAI's API does: ``ek_`` and 192 random bits, good for **one** Realtime
WebSocket (``/v1/realtime``) before it expires, and carrying the session's
settings, which that call starts with.  A page then holds a key worth one call
of a minute or so, never the server's token.

:class:`ClientSecrets` owns them on a clock passed in (the server's); a secret
is stored by its SHA-256, so a lookup's timing tells nothing of the secret.  A
spent secret stays (as spent) until it would have expired, so a second use is
told so; the outstanding ones are capped, so a flood of mints cannot grow
memory without bound (the next is refused with 429 until some expire).
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._errors import EventError
from ._realtime import SessionConfig, apply_session_update

PREFIX = "ek_"  # what a client secret starts with (as OpenAI's ephemeral keys)
MIN_SECONDS, MAX_SECONDS = 10, 7200  # what ``expires_after.seconds`` may ask (OpenAI's bounds)
MAX_OUTSTANDING = 10_000  # secrets alive (unspent, or spent and not yet expired) at once


@dataclasses.dataclass(frozen=True)
class ClientSecret:
    """A minted secret: its value (given once, to the minter), when it expires on the owner's clock, its settings."""

    value: str
    expires: float
    config: SessionConfig


@dataclasses.dataclass
class _Entry:
    expires: float
    config: SessionConfig
    spent: bool = False


class ClientSecrets:
    """The outstanding client secrets of one server: :meth:`mint`, :meth:`spend`, expiring on the clock passed in."""

    def __init__(self, *, cap: int = MAX_OUTSTANDING):
        self.cap = cap
        self._entries: dict[bytes, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def mint(self, config: SessionConfig, *, seconds: float, now: float) -> ClientSecret | None:
        """A new secret good until ``now + seconds``; None when :attr:`cap` secrets are alive (try later)."""
        if len(self._entries) >= self.cap:
            self._forget_expired(now)
            if len(self._entries) >= self.cap:
                return None
        value = PREFIX + secrets.token_urlsafe(24)  # 192 random bits
        self._entries[_key(value)] = _Entry(now + seconds, config)
        return ClientSecret(value, now + seconds, config)

    def spend(self, value: str, *, now: float) -> SessionConfig | str:
        """The settings of secret ``value``, which is spent now; or why it cannot be (for a 401's message)."""
        key = _key(value)
        entry = self._entries.get(key)
        if entry is None:
            return "this client secret is unknown (or expired a while ago); mint a new one"
        if now >= entry.expires:
            del self._entries[key]
            return "this client secret has expired; mint a new one just before the call"
        if entry.spent:
            return "this client secret was used already: it is good for one call; mint a new one"
        entry.spent = True
        return entry.config

    def _forget_expired(self, now: float) -> None:
        self._entries = {key: entry for key, entry in self._entries.items() if now < entry.expires}


def _key(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def parse_secret_request(
    body: Any,
    *,
    default_seconds: float,
    max_prompt_chars: int,
    voices: Callable[[], Sequence[str]],
) -> tuple[float, SessionConfig]:
    """How long a secret asked for by ``body`` (the SDK's ``client_secrets.create`` JSON) lives, and its settings,
    checked as a Realtime ``session.update`` would be.  Raises :class:`EventError` (with ``param``) for a bad one.
    """
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise EventError("the body must be a JSON object", param=None)
    seconds = default_seconds
    expires_after = body.get("expires_after")
    if expires_after is not None:
        if not isinstance(expires_after, Mapping):
            raise EventError("expires_after must be an object", param="expires_after")
        if expires_after.get("anchor", "created_at") != "created_at":
            raise EventError("expires_after.anchor can only be 'created_at'", param="expires_after.anchor")
        if "seconds" in expires_after:
            asked = expires_after["seconds"]
            if isinstance(asked, bool) or not isinstance(asked, int) or not MIN_SECONDS <= asked <= MAX_SECONDS:
                raise EventError(
                    f"expires_after.seconds must be a whole number from {MIN_SECONDS} to {MAX_SECONDS}",
                    param="expires_after.seconds",
                )
            seconds = asked
    return seconds, session_settings(body.get("session"), max_prompt_chars=max_prompt_chars, voices=voices)


def session_settings(
    session: Any,
    *,
    max_prompt_chars: int,
    voices: Callable[[], Sequence[str]],
    base: SessionConfig | None = None,
) -> SessionConfig:
    """The settings a call starts with when they come with its request (a client secret's, a WebRTC offer's
    ``session``), over ``base``: checked whole, as a Realtime ``session.update`` would be, a bad voice included.
    Raises :class:`EventError` (with ``param``)."""
    if session is None:
        return base or SessionConfig()
    if not isinstance(session, Mapping):
        raise EventError("session must be an object", param="session")
    if session.get("type", "realtime") != "realtime":
        raise EventError("this server takes Realtime sessions only (session.type 'realtime')", param="session.type")
    config, voice_error = apply_session_update(
        base or SessionConfig(), session, started=False, max_prompt_chars=max_prompt_chars, voices=voices
    )
    if voice_error is not None:  # (a call would only be told later: the settings are checked whole)
        raise voice_error
    return config
