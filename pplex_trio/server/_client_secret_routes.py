"""``POST /v1/realtime/client_secrets``: a short-lived, one-use client secret for a page to hold (OpenAI's route).

The request is the ``openai`` SDK's ``client.realtime.client_secrets.create(expires_after=..., session=...)``
and needs the server's token (the gate's; a client secret cannot mint more).  The answer is the SDK's
``ClientSecretCreateResponse``: the secret (``value``), ``expires_at`` (Unix seconds) and the session as a
call opened with the secret starts it.  The secrets themselves are ``protocol/_client_secrets.py``'s.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import trio
from quart import Response, jsonify, request

from ..protocol import Dialect, EventError, ServerEvents, parse_secret_request
from .sessions import NO_TRANSCRIBER

logger = logging.getLogger(__name__)


def add_client_secret_routes(app: Any, server: Any, model: str) -> None:
    """Add the route to ``app`` (Quart), minting into ``server.client_secrets``; ``model``: the sessions' model name."""

    @app.post("/v1/realtime/client_secrets")
    async def client_secrets() -> tuple[Response, int] | Response:
        settings = server.settings
        try:
            body = json.loads(await request.get_data() or b"null")
        except ValueError:
            return error_response(EventError("the body is not JSON", param=None), 400)
        try:
            seconds, config = parse_secret_request(
                body,
                default_seconds=settings.client_secret_seconds,
                max_prompt_chars=settings.max_prompt_chars,
                voices=server.voices,
            )
        except EventError as exc:
            return error_response(exc, 400)
        if config.transcription is not None and server.engine.transcript_delay is None:
            # (a call would only be told once it opened: a secret's settings are checked whole, here)
            refusal = EventError(
                NO_TRANSCRIBER, param="session.audio.input.transcription", code="transcription_unavailable"
            )
            return error_response(refusal, 400)
        minted = server.client_secrets.mint(config, seconds=seconds, now=trio.current_time())
        if minted is None:
            logger.info("refused a client secret to %s: too many outstanding (429)", request.remote_addr)
            return error_response(
                EventError(
                    "too many client secrets are outstanding; try again once some have been used or expired",
                    code="rate_limit_exceeded",
                    kind="rate_limit_error",
                ),
                429,
            )
        logger.info("minted a client secret for %s, good for %d s", request.remote_addr, seconds)
        session = ServerEvents(Dialect.GA, model=model).session(config)
        response = jsonify(value=minted.value, expires_at=int(time.time() + seconds), session=session)
        response.headers["Cache-Control"] = "no-store"
        return response


def error_response(exc: EventError, status: int) -> tuple[Response, int]:
    """An OpenAI-style error body (what the SDK reads into its ``APIStatusError``), never cached."""
    error = {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.code}
    response = jsonify(error=error)
    response.headers["Cache-Control"] = "no-store"
    return response, status
