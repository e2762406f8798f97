"""Conversation settings from a client: query strings and ``open`` messages.

The official PersonaPlex client sends every sampling setting, the persona and
the voice as query parameters of ``/api/chat``; our raw protocol carries the
same names in its JSON ``open`` message.  One validator serves both, so a bad
value gets the same clear message on either endpoint.  Unknown names are
ignored (the official client adds ``worker_auth_id``, ``email``; Kyutai's adds
``image_url``): rejecting them would break real clients.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .._voice_catalogue import is_bare_voice_name
from .._conversation import Conversation, Sampling
from ._errors import CloseCode, ProtocolError

MAX_TEMPERATURE = 10.0
MAX_TOPK = 1_000_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def parse_query(query: bytes | str) -> dict[str, str]:
    """Form-decode a query string (``+`` is a space); the last value of a repeated name wins."""
    if isinstance(query, bytes):
        try:
            query = query.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("query string is not valid UTF-8", CloseCode.POLICY) from None
    try:
        pairs = urllib.parse.parse_qsl(
            query, keep_blank_values=True, strict_parsing=False, errors="strict"
        )
    except UnicodeDecodeError:
        raise ProtocolError("query string is not valid UTF-8 after %-decoding") from None
    return dict(pairs)


def conversation_from_params(params: Mapping[str, Any], *, max_prompt_chars: int) -> Conversation:
    """Validate client settings into a :class:`Conversation`.

    Accepts the query names of the official client (``text_prompt``,
    ``voice_prompt``, ``text_temperature`` …) and, for the raw protocol, the
    short names ``persona`` and ``voice``.  Raises :class:`ProtocolError`
    (close code 1008) naming the bad parameter and what it should be.
    """
    defaults = Sampling()
    sampling = Sampling(
        text_temperature=_float(params, "text_temperature", defaults.text_temperature, 0.0, MAX_TEMPERATURE),
        text_topk=_int(params, "text_topk", defaults.text_topk, 1, MAX_TOPK),
        audio_temperature=_float(params, "audio_temperature", defaults.audio_temperature, 0.0, MAX_TEMPERATURE),
        audio_topk=_int(params, "audio_topk", defaults.audio_topk, 1, MAX_TOPK),
        text_seed=_seed(params, "text_seed"),
        audio_seed=_seed(params, "audio_seed"),
        pad_mult=_float(params, "pad_mult", defaults.pad_mult, -100.0, 100.0),
        repetition_penalty_context=_int(
            params, "repetition_penalty_context", defaults.repetition_penalty_context, 0, 100_000
        ),
        repetition_penalty=_float(params, "repetition_penalty", defaults.repetition_penalty, 0.01, 100.0),
    )
    persona = _text(params, ("text_prompt", "persona"))
    if len(persona) > max_prompt_chars:
        raise ProtocolError(
            f"text_prompt has {len(persona)} characters; the limit is {max_prompt_chars}: "
            "shorten the persona"
        )
    if "\x00" in persona:
        raise ProtocolError("text_prompt must not contain NUL characters")
    voice = _text(params, ("voice_prompt", "voice")) or None
    if voice is not None:
        check_voice_name(voice)
    return Conversation(persona=persona, voice=voice, sampling=sampling)


def check_voice_name(name: str) -> None:
    """A voice is a bare file name inside the voice directory, nothing else."""
    if not is_bare_voice_name(name):
        raise ProtocolError(
            f"voice_prompt {name[:80]!r} is not a voice name: give a bare file name such as "
            "'NATF0.pt' (see /api/voices)"
        )


def _text(params: Mapping[str, Any], names: tuple[str, ...]) -> str:
    for name in names:
        if name in params and params[name] is not None:
            value = params[name]
            if not isinstance(value, str):
                raise ProtocolError(f"{name} must be a string")
            return value.strip()
    return ""


def _raw(params: Mapping[str, Any], name: str) -> Any:
    value = params.get(name)
    if isinstance(value, str):
        value = value.strip()
        if value == "":
            return None
    return value


def _float(params: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = _raw(params, name)
    if value is None:
        return default
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ProtocolError(f"{name} must be a number between {low:g} and {high:g}, got {value!r:.40}") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise ProtocolError(f"{name} must be a number between {low:g} and {high:g}, got {value!r:.40}")
    return number


def _int(params: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = _raw(params, name)
    if value is None:
        return default
    number = _as_int(value)
    if number is None or not low <= number <= high:
        raise ProtocolError(f"{name} must be a whole number between {low} and {high}, got {value!r:.40}")
    return number


def _seed(params: Mapping[str, Any], name: str) -> int | None:
    value = _raw(params, name)
    if value is None:
        return None
    number = _as_int(value)
    if number is None or not INT64_MIN <= number <= INT64_MAX:
        raise ProtocolError(f"{name} must be a whole number (64-bit), got {value!r:.40}")
    return number


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value, 10)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                return None
            return int(number) if math.isfinite(number) and number.is_integer() else None
    return None
