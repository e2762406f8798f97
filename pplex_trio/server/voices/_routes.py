"""The voice API: ``POST /api/voices?name=NAME`` (a clip in; a voice made and kept), ``DELETE
/api/voices/NAME``, ``GET /api/voices``.

The upload is served on ASGI directly, not by Quart, so that its body is
read under its own limits (a declared length over the limit is refused
before a byte is read; a body that grows past it, or arrives too slowly, is
cut off) and never buffered anywhere else.  Everything that can be checked
before reading is checked first, cheapest first.  Each refusal is one JSON
``{"error": …}`` with the status that says what kind of problem it is, and
one log line, never a traceback.  The voice is made by the engine actor
between ticks (:meth:`~pplex_trio.engine.EngineActor.run_job`), so the
live conversations lose nothing to it.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from quart import Response, jsonify

from ...codec import load_libraries, voice_audio
from ._store import StoreRefusal, VoiceLimits

logger = logging.getLogger(__name__)

# The Content-Types of an upload, and the file suffix sphn is told.
AUDIO_TYPES = {
    "audio/wav": ".wav",
    "audio/x-wav": ".wav",
    "audio/wave": ".wav",
    "audio/vnd.wave": ".wav",
    "audio/flac": ".flac",
    "audio/x-flac": ".flac",
    "audio/mpeg": ".mp3",
    "audio/mp3": ".mp3",
    "audio/ogg": ".ogg",
}


class Refusal(Exception):
    """An upload refused: the HTTP ``status``, the client's ``message``, and the ``Retry-After`` seconds, if any."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


class _ClientGone(Exception):
    """The client disconnected before its body was whole: there is nobody to answer."""


class VoiceUpload:
    """The ``POST /api/voices`` ASGI handler of one server (``server``: its :class:`ServerContext`)."""

    def __init__(self, server: Any, clock: Callable[[], float] = time.monotonic):
        self.server = server
        self._clock = clock
        self._recent: dict[str, collections.deque[float]] = {}  # per address: when it uploaded, last minute
        self._busy = 0  # uploads in progress
        self._decoders = trio.CapacityLimiter(2)
        if server.settings.voice_uploads_allowed:
            load_libraries()  # (at start, not at the first upload, while conversations run)

    @property
    def limits(self) -> VoiceLimits:
        """The voice store's limits: clip size and length, store size, uploads a minute per address and at once."""
        return self.server.voice_store.limits

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[..., Any]) -> None:
        client = (scope.get("client") or ("?",))[0]
        began = self._clock()
        try:
            if not self.server.settings.voice_uploads_allowed:
                raise Refusal(
                    403, "this server does not take voice uploads: its operator can allow them with --voice-uploads on"
                )
            self._check_rate(client)
            if self._busy >= self.limits.at_once:
                raise Refusal(429, f"{self._busy} voices are being added now; try again in a few seconds", 5)
            self._busy += 1
            try:
                name, seconds = await self._add(scope, receive)
            finally:
                self._busy -= 1
        except _ClientGone:
            logger.info("voice upload from %s: the client left before its clip was whole", client)
            self._count("client_gone")
            return
        except (Refusal, StoreRefusal) as refusal:
            logger.info("refused a voice upload from %s: %s (%d)", client, refusal.message, refusal.status)
            self._count(str(refusal.status))
            await _answer(send, refusal.status, {"error": refusal.message}, getattr(refusal, "retry_after", None))
            return
        logger.info(
            "added voice %s from %s: a %.1f s clip, made in %.2f s", name, client, seconds, self._clock() - began
        )
        self._count("added")
        await _answer(send, 201, {"voice": name, "seconds": round(seconds, 2)})

    async def _add(self, scope: dict[str, Any], receive: Callable[[], Any]) -> tuple[str, float]:
        server, store, limits = self.server, self.server.voice_store, self.limits
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in AUDIO_TYPES:
            raise Refusal(
                415,
                "send the clip as the body, with Content-Type audio/wav, audio/flac, audio/mpeg or "
                f"audio/ogg (not {kind or 'none'!r})",
            )
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
        name = (query.get("name") or [""])[0]
        if not name:
            raise Refusal(400, "name the voice: POST /api/voices?name=NAME")
        file_name = store.check_name(name, list(server.engine.voices()))
        store.check_room()
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limits.max_bytes):
            raise Refusal(
                413 if declared.isdigit() else 400,
                _too_big(limits) if declared.isdigit() else "the Content-Length header is not a number",
            )
        with store.making(file_name):
            body = await self._read_body(receive)
            # The client now waits in silence for the answer, and its connection is cut after
            # --client-timeout without a byte from it: the answer must come before that.
            timeout = server.settings.client_timeout
            answer_by = trio.current_time() + max(timeout - 1.0, timeout / 2)
            pcm = await self._decode(body, AUDIO_TYPES[kind])
            seconds = len(pcm) / server.engine.sample_rate
            if seconds < limits.min_seconds:
                raise Refusal(
                    422,
                    f"the clip holds {seconds:.2f} s of audio: a voice needs at least "
                    f"{limits.min_seconds:g} s (a few seconds of one person speaking)",
                )
            data = await self._make(pcm, answer_by)
            await trio.to_thread.run_sync(store.add, file_name, data)  # (its fsyncs would stall the event loop)
        return file_name, seconds

    async def _read_body(self, receive: Callable[[], Any]) -> bytes:
        limits = self.limits
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(limits.body_seconds) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limits.max_bytes:
                    raise Refusal(413, _too_big(limits))
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if deadline.cancelled_caught:
            raise Refusal(408, f"the clip did not arrive within {limits.body_seconds:g} s: send it in one go")
        if size == 0:
            raise Refusal(400, "the body is empty: send the clip as the request body")
        return b"".join(chunks)

    async def _decode(self, body: bytes, suffix: str):
        """The clip as the model's audio (in a worker thread: decoding is CPU work); 422 for one that cannot be
        a voice."""
        rate, limit = self.server.engine.sample_rate, self.limits.max_seconds

        def decode():
            fd, path = tempfile.mkstemp(suffix=suffix, prefix="pplex-voice-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
                return voice_audio(Path(path), rate, max_seconds=limit)
            finally:
                os.unlink(path)

        try:
            return await trio.to_thread.run_sync(decode, limiter=self._decoders)
        except ValueError as exc:
            raise Refusal(422, str(exc)) from None

    async def _make(self, pcm, answer_by: float) -> bytes:
        try:
            with trio.fail_at(answer_by):
                return await self.server.actor.run_job(self.server.engine.make_voice(pcm))
        except trio.TooSlowError:
            raise Refusal(503, "the model was too busy to make the voice in time; try again later", 30) from None
        except NotImplementedError as exc:
            raise Refusal(501, str(exc)) from None
        except ValueError as exc:
            raise Refusal(422, str(exc)) from None
        except RuntimeError as exc:
            raise Refusal(500, str(exc)) from None

    def _check_rate(self, client: str) -> None:
        now, per_minute = self._clock(), self.limits.per_minute
        if len(self._recent) > 10_000:  # forget the addresses that have been quiet for a minute
            self._recent = {a: times for a, times in self._recent.items() if times[-1] > now - 60}
        recent = self._recent.setdefault(client, collections.deque())
        while recent and recent[0] <= now - 60:
            recent.popleft()
        if len(recent) >= per_minute:
            wait = math.ceil(recent[0] + 60 - now)
            raise Refusal(
                429, f"at most {per_minute} voice uploads a minute from one address; try again in {wait} s", wait
            )
        recent.append(now)

    def _count(self, result: str) -> None:
        self.server.metrics.voice_uploads.labels(result).inc()


def _too_big(limits: VoiceLimits) -> str:
    return (
        f"the clip is over {limits.max_bytes / 2**20:g} MiB: a voice needs a few seconds of speech "
        f"(at most {limits.max_seconds:g} s)"
    )


async def _answer(send: Callable[..., Any], status: int, body: dict[str, Any], retry_after: int | None = None) -> None:
    data = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def add_voice_routes(app: Any, server: Any) -> None:
    """``GET /api/voices`` and ``DELETE /api/voices/NAME`` on the Quart ``app``."""

    @app.get("/api/voices")
    async def voices() -> Response:
        return jsonify(
            voices=list(server.voices()), added=server.added_voices(), uploads=server.settings.voice_uploads_allowed
        )

    @app.delete("/api/voices/<name>")
    async def delete_voice(name: str) -> tuple[Response, int]:
        if not server.settings.voice_uploads_allowed:
            return jsonify(
                error="this server does not take voice uploads, nor deletions: its operator can allow "
                "them with --voice-uploads on"
            ), 403
        if name in server.engine.voices() or f"{name}.pt" in server.engine.voices():
            return jsonify(error=f"{name} is one of the model's own voices, which cannot be deleted"), 409
        try:
            removed = server.voice_store.remove(name)
        except StoreRefusal as refusal:
            return jsonify(error=refusal.message), refusal.status
        logger.info("deleted voice %s", removed)
        server.metrics.voice_uploads.labels("deleted").inc()
        return jsonify(deleted=removed), 200
