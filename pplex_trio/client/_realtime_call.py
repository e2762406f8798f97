"""``pplex-trio client --protocol realtime``: one call on the OpenAI Realtime protocol (GA events), resumed after
a dropped connection when asked (``reconnect_seconds``; ``_resume.py``).

Resuming is opt-in on Realtime: the first connection asks with ``?resumable=1`` and keeps the latest
``session.resume_token`` (in ``session.updated``, and in the ``session.created`` of a resumed connection); a
dropped one reconnects to ``?resume=TOKEN``, which goes on at once (no ``session.update``, no
``response.create``).  OpenAI's Realtime has no hang-up, so a resumable call ends with pplex-trio's own
``session.close`` (Live's name): without it the server would take the end for a drop and hold the call's slot
for its window (``--resume-seconds``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import trio

from .._conversation import SAMPLE_RATE
from ..codec import pcm16_decode, pcm16_encode
from ._call import IDLE_TIMEOUT, Answer, CallLine, ClientError, ClientResult, frames_of, until_set, with_query
from ._resume import ResumableCall, resuming_call


async def stream_realtime(
    url: str,
    pcm: np.ndarray,
    session: dict[str, Any],
    *,
    tail_seconds: float = 2.0,
    idle_timeout: float = IDLE_TIMEOUT,
    reconnect_seconds: float = 0.0,
    **connect: Any,
) -> ClientResult:
    """The OpenAI Realtime protocol, PCM16 at 24 kHz both ways, paced in real time; ``session``: a
    session.update's; :class:`CallFailed` on an error event or an abnormal end.  ``reconnect_seconds`` above 0
    asks for a resume token (``resumable=1``) and resumes a dropped call with it."""
    answer = Answer(pcm.size)
    frames = frames_of(np.concatenate([pcm, np.zeros(int(tail_seconds * SAMPLE_RATE), np.float32)]))
    resumable = reconnect_seconds > 0

    def address(call: ResumableCall) -> str:
        if call.resuming:
            return with_query(url, {"resume": call.token or ""}, keep=False)  # (the call keeps its settings)
        return with_query(url, {"resumable": "1"}) if resumable else url

    def noted(event: dict[str, Any], call: ResumableCall) -> dict[str, Any]:
        """``event``, its resume token (if it carries one) kept as the call's latest."""
        if event.get("type") in ("session.created", "session.updated"):
            call.token = (event.get("session") or {}).get("resume_token") or call.token
        elif event.get("type") == "error":
            raise ClientError(event["error"]["message"])
        return event

    async def until(ws: CallLine, call: ResumableCall, kind: str) -> None:
        while noted(json.loads(await ws.get_message()), call)["type"] != kind:
            pass

    async def leg(ws: CallLine, call: ResumableCall) -> None:
        if not call.resuming:
            await until(ws, call, "session.created")
            await ws.send_message(json.dumps({"type": "session.update", "session": session}))
            await until(ws, call, "session.updated")
            # Start the conversation and stream once it is live (audio before that is not heard).
            await ws.send_message(json.dumps({"type": "response.create"}))
        await until(ws, call, "response.created")  # (a resume: after its session.created, with no message)
        first = call.started()
        done = trio.Event()

        async def send() -> None:
            for index in range(first, len(frames)):
                audio = base64.b64encode(pcm16_encode(frames[index])).decode()
                await ws.send_message(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                await trio.sleep_until(call.deadline(index + 1))
            done.set()

        async def receive() -> None:
            while True:
                event = noted(json.loads(await ws.get_message()), call)
                kind = event.get("type")
                if kind == "response.output_audio.delta":
                    answer.audio(pcm16_decode(base64.b64decode(event["delta"])))
                elif kind == "response.output_audio_transcript.delta":
                    answer.piece(event["delta"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            nursery.start_soon(until_set, done, receive)
        if resumable:  # the call is over, not dropped: the server lets its slot go at once
            await ws.send_message(json.dumps({"type": "session.close"}))

    return await resuming_call(leg, answer, address, idle_timeout, dict(connect), reconnect_seconds)
