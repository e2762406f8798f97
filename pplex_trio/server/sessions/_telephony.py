"""A phone call's media stream on the session core, for any carrier (Twilio, Telnyx, Plivo, Exotel:
``docs/TELEPHONY.md``).

The carrier (a :class:`~pplex_trio.protocol.telephony.Carrier`) says what its
events mean; this adapter is the same for all of them:

* the opening: the carrier's ``connected`` is taken; its ``start`` gives the
  conversation, persona and voice from the answer document's parameters
  (the start event's, over those of the stream URL's query, where carriers
  that cannot hand parameters to the start event put them: Plivo, Exotel),
  checked as on every endpoint, and, when the server has a token, the
  ``token`` parameter, which must be the server's (most streams' URLs carry
  none: the gate lets the upgrade through for this check, made before a slot
  is taken);
* the caller's audio (G.711 at 8 kHz, 20 ms a message) feeds the model through
  the session core's framer, which cuts 80 ms frames from whatever it is given;
* every 80 ms frame of the model's voice goes out as one ``media`` message;
* barge-in: when the caller starts speaking (an energy VAD on their audio) a
  ``clear`` goes out before the next frame, so the carrier drops the model's
  audio it still holds; after that next frame, a ``mark`` (``barge-in-N``),
  which the carrier echoes once the model's new audio starts playing.  The
  echoes, and the keys a caller presses (``dtmf``), are taken without effect;
* the carrier's ``stop`` (the caller hung up) ends the session at once, with
  nothing flushed: the slot is free at the next engine call.

Media Streams have no error event: why a call was closed is its close frame's
code and reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..._conversation import SAMPLE_RATE, CloseCode, Conversation
from ...codec import EnergyVAD
from ...engine import OutputFrame
from ...protocol import ProtocolError, conversation_from_params, parse_query, same_secret, telephony
from ._audio_io import AudioIn, AudioOut
from ._wire import Hangup, InputAudio, InputEvent, Message, Notices, OpensWithMessage, PendingEvents, Replies

TOKEN_PARAMETER = "token"  # the answer document's parameter that carries the server's token


class TelephonyProtocol(OpensWithMessage):
    """One phone call's media stream through ``carrier``: opened by its ``start`` event, its audio format both ways."""

    early_audio = True  # what the caller says from the start on is heard, in order
    opening_hint = "a carrier's stream opens with its start event"

    def __init__(
        self,
        carrier: telephony.Carrier,
        *,
        token: str | None,
        voices: Callable[[], Sequence[str]],
        max_prompt_chars: int,
        align: bool,
    ):
        self.carrier = carrier
        self.name = carrier.name
        self.align_input = align
        self.notices = Notices()
        self.call: telephony.CallStart | None = None
        self._token = token
        self._voices = voices
        self._max_prompt_chars = max_prompt_chars
        self._audio_in: AudioIn | None = None
        self._audio_out: AudioOut | None = None
        self._vad = EnergyVAD(SAMPLE_RATE)
        self._pending = PendingEvents()  # a barge-in's clear
        self._mark_after_next_frame = False
        self._marks = itertools.count(1)

    def call_details(self) -> dict[str, Any]:
        if self.call is None:
            return {}
        return {"call": {"id": self.call.call_id, "stream": self.call.stream_id, "account": self.call.account_id}}

    # -- the opening ---------------------------------------------------------------

    def opening(self, query: bytes, message: bytes | str) -> Conversation | Replies | Hangup:
        event = self.carrier.parse(message)
        if isinstance(event, telephony.CallStop):
            return Hangup()
        if isinstance(event, telephony.CallAudio):
            raise ProtocolError(
                f"{self.name}: media before the start event; a stream starts with its start event", CloseCode.POLICY
            )
        if not isinstance(event, telephony.CallStart):
            self._note(event)
            return Replies([])
        params = {**parse_query(query), **event.parameters}
        if self._token is not None and not same_secret(params.get(TOKEN_PARAMETER, ""), self._token):
            raise ProtocolError(
                f"this server needs its access token as the stream's '{TOKEN_PARAMETER}' parameter: "
                "give it in the answer URL (see docs/TELEPHONY.md)",
                CloseCode.POLICY,
            )
        conversation = conversation_from_params(params, max_prompt_chars=self._max_prompt_chars, voices=self._voices())
        self.call = event
        self._audio_in = AudioIn(event.audio_format)
        self._audio_out = AudioOut(event.reply_format or event.audio_format)
        return conversation

    def _note(self, event: telephony.CallEvent | None) -> None:
        if isinstance(event, telephony.CallDtmf):
            self.notices.note("dtmf: taken without effect (the model hears the call's audio only)", key="dtmf")
        elif event is None:
            self.notices.note("an event this server does not use: ignored", key="unknown")

    def take_notices(self) -> list[str]:
        return self.notices.take()

    # -- the call ---------------------------------------------------------------------

    def parse(self, message: Message) -> InputEvent:
        event = self.carrier.parse(message)
        if isinstance(event, telephony.CallAudio):
            return InputAudio(event.audio) if event.audio else None
        if isinstance(event, telephony.CallStop):
            return Hangup()
        if isinstance(event, telephony.CallStart):
            raise ProtocolError(f"{self.name}: a second start event on one stream", CloseCode.POLICY)
        self._note(event)  # (a mark's echo, connected again: nothing to do)
        return None

    def decode(self, payloads: list[Any]) -> list[np.ndarray]:
        assert self._audio_in is not None
        out = []
        for data in payloads:
            pcm = self._audio_in(data)
            if any(speech.started for speech in self._vad.feed(pcm)):
                self._pending.add(self.carrier.clear())  # barge-in: the carrier drops the model's audio it holds
                self._mark_after_next_frame = True
            out.append(pcm)
        return out

    # -- output -----------------------------------------------------------------------

    def keepalive(self, position: int | None) -> Message | None:
        return None  # (a phone line has nothing to say while the call waits: the caller hears silence)

    def ready(self) -> list[Message]:
        return []

    async def encode(self, frames: list[OutputFrame]) -> list[tuple[Message, OutputFrame | None]]:
        assert self._audio_out is not None
        messages: list[tuple[Message, OutputFrame | None]] = [*self._pending.take()]
        for frame in frames:
            messages.append((self.carrier.media(self._audio_out(frame.pcm)), frame))
            if self._mark_after_next_frame:
                self._mark_after_next_frame = False
                messages.append((self.carrier.mark(f"barge-in-{next(self._marks)}"), None))
        return messages
