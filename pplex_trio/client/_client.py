"""``pplex-trio client``: stream a wav file through a running server in real time.

It speaks every protocol: ``moshi`` (real Ogg Opus through sphn, exactly
what a browser sends), ``raw`` (float32 PCM) or ``realtime`` (OpenAI Realtime
events, PCM16).  It writes the agent's audio
(as long as the input) and its text pieces with their times.

Whatever happens to the connection (a reset, a close with or without a close
frame, a server that goes silent), the ``stream_*`` functions raise
:class:`CallFailed` with what was received so far, and :func:`run_client`
writes that before it re-raises: the command line then ends with one line.
"""

from __future__ import annotations

import json
import logging
import pathlib
import ssl
import urllib.parse
from typing import Any, TypedDict

import numpy as np
import sphn
import trio

from .._conversation import FRAME_SIZE, SAMPLE_RATE
from ..protocol import moshi
from ._call import (
    IDLE_TIMEOUT,
    Answer,
    CallFailed,
    CallLine,
    ClientError,
    ClientResult,
    frames_of,
    until_set,
    with_query,
)
from ._realtime_call import stream_realtime
from ._resume import RECONNECT_SECONDS, ResumableCall, resuming_call

logger = logging.getLogger(__name__)

PATHS = {"moshi": "/api/chat", "raw": "/v1/audio/duplex", "realtime": "/v1/realtime"}


class _Connect(TypedDict):
    """:func:`open_websocket`'s arguments that the ``stream_*`` functions pass on, and their ``idle_timeout``."""

    token: str | None
    ssl_context: ssl.SSLContext | None
    idle_timeout: float


def conversation_url(base: str, protocol: str, params: dict[str, str]) -> str:
    """``base`` may be ``http(s)://`` or ``ws(s)://``; a bare host path gets the protocol's route."""
    parts = urllib.parse.urlsplit(base)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"server URL must start with http://, https://, ws:// or wss://, got {base!r}")
    path = parts.path if parts.path not in ("", "/") else PATHS[protocol]
    query = urllib.parse.urlencode(params) if protocol == "moshi" else ""
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, query, ""))


def read_wav(path: str | pathlib.Path) -> np.ndarray:
    """Mono float32 at 24 kHz (resampled and downmixed if needed)."""
    data, _ = sphn.read(str(path), sample_rate=SAMPLE_RATE)
    return np.ascontiguousarray(data.mean(axis=0), dtype=np.float32)


async def stream_moshi(
    url: str,
    pcm: np.ndarray,
    *,
    tail_seconds: float = 2.0,
    idle_timeout: float = IDLE_TIMEOUT,
    reconnect_seconds: float = 0.0,
    **connect: Any,
) -> ClientResult:
    """``url``: with its query's settings; ``connect``: :func:`open_websocket`'s ``ssl_context`` and ``token``;
    :class:`CallFailed` for an abnormal end (``idle_timeout``: seconds the server may send nothing).
    ``reconnect_seconds`` above 0 asks for a resume token (``resumable=1``) and resumes a dropped call with it
    (``_resume.py``); the call then ends with a hang-up (``0x12``), not a mere close, which would pause it."""
    answer = Answer(pcm.size)
    frames = frames_of(pcm)
    resumable = reconnect_seconds > 0

    def address(call: ResumableCall) -> str:
        if call.resuming:
            return with_query(url, {"resume": call.token or ""}, keep=False)  # (the call keeps its settings)
        return with_query(url, {"resumable": "1"}) if resumable else url

    async def leg(ws: CallLine, call: ResumableCall) -> None:
        writer, reader = sphn.OpusStreamWriter(SAMPLE_RATE), sphn.OpusStreamReader(SAMPLE_RATE)  # (streams anew)
        await _wait_moshi_handshake(ws)
        first = call.started()
        if first == 0:
            logger.info("handshake received; streaming %.1f s of audio", pcm.size / SAMPLE_RATE)
        done = trio.Event()

        async def receive() -> None:
            while True:
                message = await ws.get_message()
                if not isinstance(message, bytes) or not message:
                    continue
                kind, payload = message[0], message[1:]
                if kind == moshi.Kind.AUDIO:
                    out = reader.append_bytes(payload)
                    if out.size:
                        answer.audio(out)
                        if answer.samples >= pcm.size:
                            done.set()
                elif kind == moshi.Kind.TEXT:
                    answer.piece(payload.decode("utf-8"))
                elif kind == moshi.Kind.RESUME:
                    call.token = json.loads(payload)["token"]
                elif kind == moshi.Kind.ERROR:
                    raise ClientError(payload.decode("utf-8", errors="replace"))

        async def send() -> None:
            for index in range(first, len(frames)):
                await ws.send_message(moshi.audio(writer.append_pcm(frames[index])))
                await trio.sleep_until(call.deadline(index + 1))
            # Keep the stream alive with silence until the answer is complete.
            silence = np.zeros(FRAME_SIZE, dtype=np.float32)
            index = max(first, len(frames))
            with trio.move_on_after(tail_seconds):
                while not done.is_set():
                    await ws.send_message(moshi.audio(writer.append_pcm(silence)))
                    index += 1
                    await trio.sleep_until(call.deadline(index))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            nursery.start_soon(until_set, done, receive)
        if resumable:
            await ws.send_message(moshi.hangup())  # the call is over: not a drop to pause it for

    return await resuming_call(leg, answer, address, idle_timeout, dict(connect), reconnect_seconds)


async def stream_raw(
    url: str,
    pcm: np.ndarray,
    params: dict[str, Any],
    *,
    tail_seconds: float = 2.0,
    idle_timeout: float = IDLE_TIMEOUT,
    reconnect_seconds: float = 0.0,
    **connect: Any,
) -> ClientResult:
    """The raw duplex protocol: ``params`` in the open message, float32 PCM at 24 kHz both ways, paced in real time;
    :class:`CallFailed` on an error event or an abnormal end (a close before ``done``).  ``reconnect_seconds``
    above 0: a dropped call is resumed with the token of its last ``ready`` (``_resume.py``).
    """
    answer = Answer(pcm.size)
    # Real-time pacing, then a tail of silence so delayed output can come out.
    frames = frames_of(np.concatenate([pcm, np.zeros(int(tail_seconds * SAMPLE_RATE), np.float32)]))

    async def leg(ws: CallLine, call: ResumableCall) -> None:
        opening = {"resume": call.token} if call.resuming else params
        await ws.send_message(json.dumps({"type": "open", **opening}))
        while True:
            message = await ws.get_message()
            if isinstance(message, str):
                event = json.loads(message)
                if event.get("type") == "ready":
                    call.token = event.get("resume")
                    break
                if event.get("type") == "error":
                    raise ClientError(event.get("error", "error"))
        first = call.started()

        async def send() -> None:
            for index in range(first, len(frames)):
                await ws.send_message(frames[index].astype("<f4").tobytes())
                await trio.sleep_until(call.deadline(index + 1))
            await ws.send_message(json.dumps({"type": "close"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            while True:
                message = await ws.get_message()
                if isinstance(message, bytes):
                    answer.audio(np.frombuffer(message, dtype="<f4"))
                    continue
                event = json.loads(message)
                if event.get("type") == "text" and event.get("speaker", "agent") == "agent":  # (not the caller's)
                    answer.piece(event["text"])
                elif event.get("type") == "error":
                    raise ClientError(event.get("error", "error"))
                elif event.get("type") == "done":
                    break
            nursery.cancel_scope.cancel()

    return await resuming_call(leg, answer, lambda call: url, idle_timeout, dict(connect), reconnect_seconds)


async def _wait_moshi_handshake(ws: Any) -> None:
    while True:
        message = await ws.get_message()
        if isinstance(message, bytes) and message:
            if message[0] == moshi.Kind.HANDSHAKE:
                return
            if message[0] == moshi.Kind.ERROR:
                raise ClientError(message[1:].decode("utf-8", errors="replace"))


async def run_client(
    url: str,
    input_wav: str | pathlib.Path,
    output_wav: str | pathlib.Path,
    *,
    text_json: str | pathlib.Path | None = None,
    protocol: str = "moshi",
    persona: str | None = None,
    voice: str | None = None,
    extra: dict[str, str] | None = None,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
    idle_timeout: float = IDLE_TIMEOUT,
    reconnect_seconds: float = RECONNECT_SECONDS,
) -> ClientResult:
    """``token``: the server's access token (sent as a Bearer header); ``ssl_context``: for ``wss://``;
    ``reconnect_seconds``: how long a dropped call is tried again and resumed (every protocol; 0: never).

    A call that ends abnormally raises :class:`CallFailed`, after writing what it had received (if the streaming
    had begun) to the same files; its message says what happened and what was written.
    """
    pcm = read_wav(input_wav)
    try:
        connect = _Connect(token=token, ssl_context=ssl_context, idle_timeout=idle_timeout)
        result = await _converse(url, pcm, protocol, persona, voice, extra, connect, reconnect_seconds)
    except CallFailed as failed:
        if failed.seconds is not None:
            failed.wrote = _write(failed.result, output_wav, text_json)
        raise
    logger.info("wrote %s", _write(result, output_wav, text_json))
    return result


def _write(result: ClientResult, output_wav: str | pathlib.Path, text_json: str | pathlib.Path | None) -> str:
    """Write the answer; what was written, in words."""
    sphn.write_wav(str(output_wav), result.pcm, SAMPLE_RATE)
    outage = f", {result.outage:.1f} s of it silence where the connection was lost" if result.outage else ""
    written = f"{output_wav} ({result.pcm.size / SAMPLE_RATE:.1f} s{outage})"
    if text_json is None:
        return written
    pathlib.Path(text_json).write_text(json.dumps(result.text, ensure_ascii=False, indent=1) + "\n")
    pieces = len(result.text)
    return f"{written} and {pieces} text piece{'' if pieces == 1 else 's'} to {text_json}"


async def _converse(
    url: str,
    pcm: np.ndarray,
    protocol: str,
    persona: str | None,
    voice: str | None,
    extra: dict[str, str] | None,
    connect: _Connect,
    reconnect_seconds: float,
) -> ClientResult:
    if protocol == "moshi":
        params = dict(extra or {})
        if persona is not None:
            params["text_prompt"] = persona
        if voice is not None:
            params["voice_prompt"] = voice
        url = conversation_url(url, protocol, params)
        result = await stream_moshi(url, pcm, reconnect_seconds=reconnect_seconds, **connect)
    elif protocol == "raw":
        params = {k: v for k, v in (("persona", persona), ("voice", voice)) if v is not None}
        params.update(extra or {})
        url = conversation_url(url, protocol, {})
        result = await stream_raw(url, pcm, params, reconnect_seconds=reconnect_seconds, **connect)
    elif protocol == "realtime":
        session: dict[str, Any] = {
            "type": "realtime",
            "audio": {"input": {"format": {"type": "audio/pcm"}}, "output": {"format": {"type": "audio/pcm"}}},
        }
        if persona is not None:
            session["instructions"] = persona
        if voice is not None:
            session["audio"]["output"]["voice"] = voice
        url = conversation_url(url, protocol, {})
        result = await stream_realtime(url, pcm, session, reconnect_seconds=reconnect_seconds, **connect)
    else:
        raise ValueError(f"unknown protocol {protocol!r}: use moshi, raw or realtime")
    return result
