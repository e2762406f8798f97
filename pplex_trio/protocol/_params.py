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
from collections.abc import Collection, Mapping
from typing import Any

from .._conversation import Conversation, Sampling
from .._voice_catalogue import OPENAI_VOICES, is_bare_voice_name
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
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False, errors="strict")
    except UnicodeDecodeError:
        raise ProtocolError("query string is not valid UTF-8 after %-decoding") from None
    return dict(pairs)


def conversation_from_params(
    params: Mapping[str, Any], *, max_prompt_chars: int, voices: Collection[str] | None = None
) -> Conversation:
    """Validate client settings into a :class:`Conversation`.

    Accepts the query names of the official client (``text_prompt``,
    ``voice_prompt``, ``text_temperature`` …), NVIDIA's server's ``seed``
    (both seeds, unless ``text_seed``/``audio_seed`` say otherwise; -1: none)
    and, for the raw protocol, the short names ``persona`` and ``voice`` (one
    of ``voices``, when given).
    Raises :class:`ProtocolError` (close code 1008) naming the bad parameter
    and what it should be.
    """
    defaults = Sampling()
    seed = _seed(params, "seed")  # NVIDIA's server: one seed for text and audio, -1 for none
    seed = None if seed == -1 else seed
    sampling = Sampling(
        text_temperature=_float(params, "text_temperature", defaults.text_temperature, 0.0, MAX_TEMPERATURE),
        text_topk=_int(params, "text_topk", defaults.text_topk, 1, MAX_TOPK),
        audio_temperature=_float(params, "audio_temperature", defaults.audio_temperature, 0.0, MAX_TEMPERATURE),
        audio_topk=_int(params, "audio_topk", defaults.audio_topk, 1, MAX_TOPK),
        text_seed=_seed(params, "text_seed", seed),
        audio_seed=_seed(params, "audio_seed", seed),
        pad_mult=_float(params, "pad_mult", defaults.pad_mult, -100.0, 100.0),
        repetition_penalty_context=_int(
            params, "repetition_penalty_context", defaults.repetition_penalty_context, 0, 100_000
        ),
        repetition_penalty=_float(params, "repetition_penalty", defaults.repetition_penalty, 0.01, 100.0),
    )
    param, value = _first(params, ("text_prompt", "persona"))
    persona = persona_text(value, param=param, max_chars=max_prompt_chars) if value is not None else ""
    param, value = _first(params, ("voice_prompt", "voice"))
    voice = voice_name(value, param=param, voices=voices) if value is not None and value != "" else None
    return Conversation(persona=persona, voice=voice, sampling=sampling)


# Every name :func:`conversation_from_params` reads (a resume, which keeps the call's own, says it ignored them).
SETTING_NAMES = frozenset(
    {"seed", "text_seed", "audio_seed", "text_temperature", "text_topk", "audio_temperature", "audio_topk"}
    | {"pad_mult", "repetition_penalty_context", "repetition_penalty", "text_prompt", "persona"}
    | {"voice_prompt", "voice"}
)


# -- each setting, checked once for every protocol (Realtime's session.update included) ---------


def persona_text(value: Any, *, param: str, max_chars: int) -> str:
    """The persona (system prompt text) a client gave as ``param``, stripped."""
    if not isinstance(value, str):
        raise ProtocolError(f"{param} must be a string", param=param)
    text = value.strip()
    if len(text) > max_chars:
        raise ProtocolError(
            f"{param} has {len(text)} characters; this server's limit is {max_chars}: shorten the persona",
            param=param,
            kind="string_above_max_length",
        )
    if "\x00" in text:
        raise ProtocolError(f"{param} must not contain NUL characters", param=param)
    return text


def voice_name(value: Any, *, param: str, voices: Collection[str] | None = None) -> str:
    """A voice a client named as ``param``: a bare file name inside the voice directory, nothing else, and
    with ``voices``, one of them."""
    if not isinstance(value, str):
        raise ProtocolError(f"{param} must be a string: the name of a voice (see /api/voices)", param=param)
    name = value.strip()
    if not is_bare_voice_name(name):
        raise ProtocolError(
            f"{param} {name[:80]!r} is not a voice name: give a bare file name such as 'NATF0.pt' (see /api/voices)",
            param=param,
        )
    if voices is not None and name not in voices:
        raise ProtocolError(f"unknown {param} {name!r}: see /api/voices for the voices this server has", param=param)
    return name


def voice_choice(value: Any, *, param: str, voices: Collection[str]) -> str | None:
    """A voice an OpenAI client names (Realtime, Live): one of ``voices``, ``{"id": name}``, or one of OpenAI's
    voice names, which stands for a voice of :data:`OPENAI_VOICES` (None: the engine's default, where the server
    lacks that voice)."""
    if isinstance(value, Mapping):
        value = value.get("id")
    if isinstance(value, str) and value.strip().lower() in OPENAI_VOICES:
        stand_in = OPENAI_VOICES[value.strip().lower()]
        return stand_in if stand_in in voices else None
    try:
        return voice_name(value, param=param, voices=voices)
    except ProtocolError as exc:
        raise ProtocolError(
            f"{exc.message}; OpenAI's voice names ({', '.join(OPENAI_VOICES)}) work too", param=param
        ) from None


def temperature(value: Any, *, param: str) -> float:
    """A sampling temperature a client gave as ``param``."""
    number = _float({param: value}, param, math.nan, 0.0, MAX_TEMPERATURE)
    if math.isnan(number):  # (empty)
        raise ProtocolError(f"{param} must be a number between 0 and {MAX_TEMPERATURE:g}", param=param)
    return number


def _first(params: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, Any]:
    """The first of ``names`` that ``params`` has (not None), and its value; else the first name and None."""
    for name in names:
        if params.get(name) is not None:
            return name, params[name]
    return names[0], None


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
        raise ProtocolError(
            f"{name} must be a number between {low:g} and {high:g}, got {value!r:.40}", param=name
        ) from None
    if not math.isfinite(number) or not low <= number <= high:
        raise ProtocolError(f"{name} must be a number between {low:g} and {high:g}, got {value!r:.40}", param=name)
    return number


def _int(params: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = _raw(params, name)
    if value is None:
        return default
    number = _as_int(value)
    if number is None or not low <= number <= high:
        raise ProtocolError(f"{name} must be a whole number between {low} and {high}, got {value!r:.40}", param=name)
    return number


def _seed(params: Mapping[str, Any], name: str, default: int | None = None) -> int | None:
    value = _raw(params, name)
    if value is None:
        return default
    number = _as_int(value)
    if number is None or not INT64_MIN <= number <= INT64_MAX:
        raise ProtocolError(f"{name} must be a whole number (64-bit), got {value!r:.40}", param=name)
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
