"""LiveKit Agents' GPT-Live model (``GPTLiveModel``, a ``DuplexModel``) in an ``AgentSession``, on the echo.

The model is the OpenAI plugin's re-export, as an agent would import it, with
the framework's defaults: ``delegation="responses"`` (so ``session.start``
carries the Responses model and the agent's tools, which this server does not
take: it starts the session and then says so in an ``error`` event), voice
``marin``. ``AgentSession`` wraps it in its ``DuplexRealtimeAdapter`` and runs
it as it would in a room, but with the room's tracks replaced by the session's
own I/O hooks: ``session.input.audio`` is a microphone that plays the caller's
line as a 48 kHz track in 10 ms frames, in real time, from the moment the
session has started; ``session.output.audio`` is a loudspeaker that plays what
the adapter hands it (the model's output while its gate hears sound, as
"generations"). The model's whole output, silence included, is read off the
plugin's session (``openai_server_event_received``).

LiveKit's own AEC warm-up is turned off: for the first 3 s the agent speaks it
feeds the model silence in place of the caller, which with an echo for a model
(the agent "speaks" the caller's words back at once) would silence the caller.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import numpy as np
import pytest
import soxr

pytest.importorskip("livekit.plugins.openai.realtime")

from livekit import rtc  # noqa: E402
from livekit.agents import Agent, AgentSession, ErrorEvent, UserInputTranscribedEvent, function_tool, llm  # noqa: E402
from livekit.agents.voice import io  # noqa: E402
from livekit.plugins.openai.realtime import GPTLiveModel  # noqa: E402

from _helpers.aio import run_asyncio
from _helpers.audio import best_lag

logger = logging.getLogger(__name__)

RATE = 24_000
ROOM_RATE = 48_000  # what a LiveKit room's audio track delivers; the plugin resamples to 24 kHz
CHUNK_MS = 10
PERSONA = "You are a friendly assistant. Keep your answers short."


def samples(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, "<i2").astype(np.float32) / 32768


def between(audio: bytearray, stamps: list[tuple[float, int]], since: float, until: float) -> np.ndarray:
    """The part of ``audio`` (PCM16) whose pieces came between ``since`` and ``until``; ``stamps``: (when, where)
    of each piece."""
    start = next((at for t, at in stamps if t > since), len(audio))
    end = next((at for t, at in stamps if t > until), len(audio))
    return samples(bytes(audio[start:end]))


@function_tool
async def lookup_weather(location: str) -> str:
    """Look up the weather at a location."""
    return f"sunny in {location}"


class RecordedGPTLiveModel(GPTLiveModel):
    """The plugin's model as shipped, noting every event its sessions send and read."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.sent: list[tuple[float, dict]] = []
        self.received: list[tuple[float, dict]] = []
        self.started = asyncio.Event()
        self._wanted: tuple[int, asyncio.Event] | None = None
        self.output = bytearray()  # all the model's audio, silence included
        self.output_at: list[tuple[float, int]] = []  # (when, where in output) of each delta

    def session(self):
        session = super().session()
        session.on("openai_client_event_queued", lambda event: self.sent.append((time.monotonic(), event)))
        session.on("openai_server_event_received", self._on_event)
        return session

    def _on_event(self, event: dict) -> None:
        self.received.append((time.monotonic(), event))
        if event["type"] == "session.started":
            self.started.set()
        elif event["type"] == "session.output_audio.delta":
            self.output_at.append((time.monotonic(), len(self.output)))
            self.output += base64.b64decode(event["delta"])
            if self._wanted is not None and len(self.output) >= self._wanted[0]:
                self._wanted[1].set()

    async def heard(self, seconds: float, timeout: float) -> None:
        """Until ``seconds`` of the model's audio have come in all."""
        self._wanted = (int(seconds * RATE) * 2, asyncio.Event())
        if len(self.output) < self._wanted[0]:
            await asyncio.wait_for(self._wanted[1].wait(), timeout)

    def sent_of(self, kind: str) -> list[dict]:
        return [event for _, event in self.sent if event["type"] == kind]

    def output_between(self, since: float, until: float = float("inf")) -> np.ndarray:
        """The model's audio that came between ``since`` and ``until``."""
        return between(self.output, self.output_at, since, until)

    def received_of(self, kind: str) -> list[dict]:
        return [event for _, event in self.received if event["type"] == kind]


class Microphone(io.AudioInput):
    """A room's microphone track (48 kHz, 10 ms frames, in real time) from the moment the call is up (``live``):
    what the caller is given to :meth:`say`, silence in between. The session pushes each frame to the model as
    soon as it has it, so an action :meth:`say` is given runs exactly between two frames."""

    SIZE = ROOM_RATE * CHUNK_MS // 1000

    def __init__(self, live: asyncio.Event):
        super().__init__(label="test microphone")
        self._live = live
        self._frames: list[bytes] = []
        self._actions: dict[int, Callable[[], None]] = {}
        self._said: dict[int, asyncio.Event] = {}  # set once the frame before has gone out
        self._next = 0
        self._begin: float | None = None

    def say(self, line: np.ndarray, actions_at: dict[float, Callable[[], None]] | None = None) -> asyncio.Event:
        """``line`` (24 kHz) after what is said already; ``actions_at[t]()`` runs ``t`` s into it. The event is set
        once it has all gone out."""
        pcm = (np.clip(soxr.resample(line, RATE, ROOM_RATE), -1, 32767 / 32768) * 32768).astype("<i2")
        first = max(len(self._frames), self._next)
        self._frames += [b""] * (first - len(self._frames))  # (silence went out meanwhile)
        self._frames += [pcm[i : i + self.SIZE].tobytes() for i in range(0, pcm.size - self.SIZE + 1, self.SIZE)]
        for t, action in (actions_at or {}).items():
            self._actions[first + round(t * 1000 / CHUNK_MS)] = action
        done = self._said[len(self._frames)] = asyncio.Event()
        return done

    async def __anext__(self) -> rtc.AudioFrame:
        if self._begin is None:
            await self._live.wait()  # the caller talks once the call is up
            self._begin = time.monotonic()
        n = self._next
        await asyncio.sleep(max(0.0, self._begin + n * CHUNK_MS / 1000 - time.monotonic()))
        if n in self._said:
            self._said.pop(n).set()
        if n in self._actions:
            self._actions.pop(n)()
        self._next += 1
        chunk = self._frames[n] if n < len(self._frames) and self._frames[n] else bytes(self.SIZE * 2)
        return rtc.AudioFrame(data=chunk, sample_rate=ROOM_RATE, num_channels=1, samples_per_channel=self.SIZE)


class Loudspeaker(io.AudioOutput):
    """Plays what it is given as it comes (the model's audio comes at its real-time pace)."""

    def __init__(self):
        super().__init__(label="test loudspeaker", capabilities=io.AudioOutputCapabilities(pause=False))
        self.audio = bytearray()
        self.played_at: list[tuple[float, int]] = []  # (when, where in audio) of each frame
        self._pushed = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        assert (frame.sample_rate, frame.num_channels) == (RATE, 1)
        if not self._pushed:
            self.on_playback_started(created_at=time.time())
        self._pushed += frame.duration
        self.played_at.append((time.monotonic(), len(self.audio)))
        self.audio += bytes(frame.data)

    def between(self, since: float, until: float = float("inf")) -> np.ndarray:
        """What played between ``since`` and ``until``."""
        return between(self.audio, self.played_at, since, until)

    def flush(self) -> None:
        super().flush()
        if self._pushed:
            self.on_playback_finished(playback_position=self._pushed, interrupted=False)
            self._pushed = 0.0

    def clear_buffer(self) -> None:
        if self._pushed:
            self.on_playback_finished(playback_position=self._pushed, interrupted=True)
            self._pushed = 0.0


@dataclasses.dataclass
class Call:
    model: RecordedGPTLiveModel
    session: AgentSession
    agent: Agent
    microphone: Microphone
    speaker: Loudspeaker
    items: list[llm.ChatItem]  # the conversation as the session recorded it
    errors: list[ErrorEvent]  # the session's error events
    states: list[tuple[float, str]]  # the agent's states (listening, speaking, ...), with when each began
    close_took: float = 0.0
    state_changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def on_state(self, state: str) -> None:
        self.states.append((time.monotonic(), state))
        self.state_changed.set()

    async def played_out(self, timeout: float = 5) -> None:
        """Until the agent is listening again: what the model said has all been played (the session plays the
        model's audio a little after it came; a generation ends 0.8 s into the model's silence)."""
        async with asyncio.timeout(timeout):
            while self.states[-1][1] != "listening":
                self.state_changed.clear()
                await self.state_changed.wait()

    def speaking_since(self, since: float) -> float:
        """When the agent first began speaking after ``since`` (its loudspeaker got the model's audio)."""
        return min(at for at, state in self.states if state == "speaking" and at >= since)

    async def say(self, line: np.ndarray, actions_at: dict[float, Callable[[], None]] | None = None) -> None:
        """The caller says ``line`` (see :meth:`Microphone.say`); returns once its echo has come back too."""
        until = len(self.model.output) / 2 / RATE + line.size / RATE + 0.3  # (the model's audio never stops)
        await asyncio.wait_for(self.microphone.say(line, actions_at).wait(), line.size / RATE + 5)
        await self.model.heard(until, timeout=3)

    def transcript(self) -> list[int]:
        """The model's words as the session recorded them: the echo's frame numbers."""
        return [
            int(word)
            for item in self.items
            if isinstance(item, llm.ChatMessage) and item.role == "assistant"
            for word in (item.text_content or "").split()
        ]


@contextlib.asynccontextmanager
async def call(http_url: str, **model_options) -> AsyncIterator[Call]:
    """An ``AgentSession`` on the model, started and live (``session.started`` came); closed on the way out."""
    async with aiohttp.ClientSession() as http:
        model = RecordedGPTLiveModel(
            base_url=f"{http_url}/v1", api_key="placeholder", http_session=http, **model_options
        )
        session = AgentSession(llm=model, aec_warmup_duration=None)
        agent = Agent(instructions=PERSONA, tools=[lookup_weather])
        c = Call(model, session, agent, Microphone(model.started), Loudspeaker(), [], [], [])
        session.on("conversation_item_added", lambda event: c.items.append(event.item))
        session.on("agent_state_changed", lambda event: c.on_state(event.new_state))
        session.on("error", c.errors.append)
        session.input.audio = c.microphone
        session.output.audio = c.speaker
        try:
            await session.start(agent)
            await asyncio.wait_for(model.started.wait(), 10)
            yield c
        finally:
            closing = time.monotonic()
            await session.aclose()  # session.close, then up to 5 s for session.closed
            c.close_took = time.monotonic() - closing
            await model.aclose()


def best(piece: np.ndarray, audio: np.ndarray) -> float:
    """How well ``piece`` is found anywhere in ``audio`` (the correlation at its best lag)."""
    return best_lag(piece, audio, 0, audio.size - piece.size)[1]


def longest_quiet(audio: np.ndarray, floor: float = 1e-3) -> tuple[int, int]:
    """Where the longest stretch of ``audio`` below ``floor`` starts and ends (samples)."""
    edges = np.diff(np.concatenate([[0], (np.abs(audio) < floor).astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    longest = int(np.argmax(ends - starts))
    return int(starts[longest]), int(ends[longest])


def assert_heard(utterance: np.ndarray, received: np.ndarray) -> None:
    """``assert_echoed`` without its bound on the drift between the pieces: each half second of the utterance is
    found in ``received`` (one may miss), in order.

    For the caller's second utterance, which has a pause below the server's speech threshold (-42 dBFS, some
    0.25 s from 1.04 s in). When the client stalls (its asyncio loop sends a 100 ms page late, then two at once)
    the server catches up with real time over the caller's next pause (it skips silent frames only), which may
    be this one: the echo then comes back with up to that much less of the pause, and the rest of it earlier.
    ``caller.first`` has no such pause: ``assert_echoed`` holds for it.
    """
    half = RATE // 2
    found = [
        best_lag(utterance[start : start + half], received, 0, received.size - half)
        for start in range(0, utterance.size - half + 1, half)
    ]
    report = ", ".join(f"{corr:.3f} at {lag / RATE:.2f} s" for lag, corr in found)
    good = [lag for lag, corr in found if corr >= 0.9]
    assert len(good) >= len(found) - 1 and good == sorted(good), f"the caller's speech did not come back: {report}"


def test_livekit_live_agent_session_hears_the_echo(echo_server, caller, assert_echoed):
    """Audio both ways, the transcript, generate_reply, the Responses delegation refused without harm, the close."""
    before, mark = echo_server.ended("live"), len(echo_server.log)

    async def converse() -> tuple[Call, object, float]:
        async with call(echo_server.url) as c:
            # The agent asks the model to speak first: the plugin sends session.commentary.append, which this
            # server refuses; the ask is answered by the next sound the model makes, the caller's echo.
            handle = c.session.generate_reply()
            asked = time.monotonic()
            await c.say(caller.audio)
            await asyncio.wait_for(handle.wait_for_playout(), 3)
            await c.played_out()
        return c, handle, c.speaking_since(asked) - asked

    c, handle, answered = run_asyncio(converse())
    model = c.model

    # The session started with LiveKit's defaults, tools and all; what the server does not take it said after
    # session.started, in error events that the plugin reports as recoverable: the session went on.
    (start,) = model.sent_of("session.start")
    assert model.sent[0][1] is start
    assert start["session"]["delegation"]["type"] == "responses"
    assert [tool["name"] for tool in start["session"]["delegation"]["responses"]["tools"]] == ["lookup_weather"]
    assert start["session"]["audio"]["format"] == {"type": "audio/pcm", "rate": 24000}
    (started,) = model.received_of("session.started")
    assert started["client_event_id"] == start["event_id"] and started["session"]["instructions"] == PERSONA
    (commentary,) = model.sent_of("session.commentary.append")
    errors = model.received_of("error")
    assert [(e["error"]["code"], e["client_event_id"]) for e in errors] == [
        ("unsupported_delegation", start["event_id"]),
        ("unsupported_event", commentary["event_id"]),
    ]
    kinds = [event["type"] for _, event in model.received]
    assert kinds.index("error") > kinds.index("session.started")
    assert len(c.errors) == 2 and all(event.error.recoverable for event in c.errors), c.errors
    assert echo_server.problems_since(mark) == []

    # generate_reply: answered by the first sound, the echo of the caller's first words (they start as it is
    # asked), well within the plugin's 10 s; the reply is that speech, its text the echo's frame numbers.
    assert handle.done() and handle.exception() is None and answered < 1.0, answered
    (reply,) = [item for item in handle.chat_items if item.role == "assistant"]
    assert reply.text_content.split()[:3] == ["0", "1", "2"]

    # What the agent played is the caller's speech, both utterances, through the plugin's 48 → 24 kHz
    # resampling; the model's whole output holds it too.
    played = samples(bytes(c.speaker.audio))
    assert_echoed(caller.first, played)
    assert_heard(caller.second, played)
    output = samples(bytes(model.output))
    assert_echoed(caller.first, output)
    assert_heard(caller.second, output)

    # The transcript: the echo's frame numbers in order from the first, through the second utterance's echo.
    numbers = c.transcript()
    assert numbers == list(range(len(numbers))), numbers
    assert len(numbers) >= (caller.second_starts + caller.second.size / RATE) * 1000 // 80, numbers

    # The close: aclose sent session.close, the server answered session.closed at once (LiveKit waits up to
    # 5 s for it) and ended the conversation as completed.
    assert model.sent_of("session.close") == [{"type": "session.close"}]
    (closed,) = model.received_of("session.closed")
    assert closed["reason"] == "close_requested" and abs(closed["usage"]["seconds"] - output.size / RATE) < 0.25
    assert c.close_took < 1.0, c.close_took
    echo_server.wait_closed("live", before, outcome="completed")
    logger.info(
        "livekit live: reply in %.2f s, %.2f s played of %.2f s, close in %.3f s",
        answered,
        played.size / RATE,
        output.size / RATE,
        c.close_took,
    )


def test_livekit_live_mute_input(echo_server, caller, assert_echoed):
    """``mute_input()`` mid-call: the model hears silence until ``unmute_input()``, and the call keeps its pace.

    The caller says their first utterance; the agent mutes in the pause; the caller says the second utterance
    (muted) and the agent unmutes in the pause after it; the caller says the first utterance again.
    """
    before, mark = echo_server.ended("live"), len(echo_server.log)
    mute_at = caller.second_starts - 0.4  # into the line, in its pauses
    unmute_at = caller.second_starts + caller.second.size / RATE + 0.3

    async def converse() -> Call:
        async with call(echo_server.url) as c:
            await c.say(
                caller.audio,
                {
                    mute_at: lambda: c.agent.duplex_session.mute_input(),
                    unmute_at: lambda: c.agent.duplex_session.unmute_input(),
                },
            )
            await c.say(caller.first)
        return c

    c = run_asyncio(converse())
    model = c.model
    assert [e["error"]["code"] for e in model.received_of("error")] == ["unsupported_delegation"]
    assert echo_server.problems_since(mark) == []

    (mute,), (unmute,) = model.sent_of("session.input_audio.mute"), model.sent_of("session.input_audio.unmute")
    ((muted_at, muted),) = [(at, e) for at, e in model.received if e["type"] == "session.input_audio.muted"]
    ((unmuted_at, unmuted),) = [(at, e) for at, e in model.received if e["type"] == "session.input_audio.unmuted"]
    assert (muted["client_event_id"], unmuted["client_event_id"]) == (mute["event_id"], unmute["event_id"])

    # While muted the model heard silence, so what it said back was silence for as long as the caller spoke:
    # the longest quiet stretch of its output. The caller was heard before it and after it. The output is cut
    # by its own positions, not by when the acknowledgements came in: on a busy machine the echo of a frame
    # heard before the mute may reach the client after the ``muted`` event.
    assert muted_at < unmuted_at
    output = samples(bytes(model.output))
    start, end = longest_quiet(output)
    assert (end - start) / RATE > caller.second.size / RATE, (start / RATE, end / RATE)
    assert_echoed(caller.first, output[:start])
    assert_echoed(caller.first, output[end:])
    assert [best(piece, output) < 0.3 for piece in np.split(caller.second, 4)] == [True] * 4
    (closed,) = model.received_of("session.closed")
    assert closed["usage"]["seconds"] == pytest.approx(output.size / RATE, abs=0.25)
    echo_server.wait_closed("live", before, outcome="completed")


def test_livekit_live_generate_reply_over_silence(echo_server, caller, assert_echoed):
    """Asked to speak while the caller is silent, the echo stays silent: the reply fails after LiveKit's 10 s,
    as a failed speech (the framework logs it), and the session goes on: the caller speaks again, and the agent
    plays the echo."""
    before = echo_server.ended("live")

    async def converse() -> tuple[Call, object, float, float]:
        async with call(echo_server.url) as c:
            await c.say(np.concatenate([caller.first, np.zeros(RATE // 2, np.float32)]))
            handle = c.session.generate_reply()
            asked = time.monotonic()
            await asyncio.wait_for(handle.wait_for_playout(), 12)
            failed_at = time.monotonic()
            await c.say(caller.first)  # and then the caller speaks again
            await c.played_out()
        return c, handle, asked, failed_at

    c, handle, asked, failed_at = run_asyncio(converse())
    assert [e["error"]["code"] for e in c.model.received_of("error")] == ["unsupported_delegation", "unsupported_event"]
    assert isinstance(handle.exception(), llm.RealtimeError), handle.exception()
    assert 9.5 < failed_at - asked < 11, failed_at - asked
    assert not [state for at, state in c.states if asked < at < failed_at and state == "speaking"]
    assert_echoed(caller.first, c.speaker.between(0, asked))
    assert_echoed(caller.first, c.model.output_between(failed_at))  # the model heard the caller after the failure,
    assert_echoed(caller.first, c.speaker.between(failed_at))  # and the agent played what it said back
    assert [e["reason"] for e in c.model.received_of("session.closed")] == ["close_requested"]
    echo_server.wait_closed("live", before, outcome="completed")


def test_livekit_live_agent_session_hears_the_callers_words(hearing_server, caller):
    """A server that transcribes sends the caller's words (Live has no opt-in; LiveKit's GPT-Live model says it
    transcribes the user): the ``AgentSession`` emits ``user_input_transcribed``, interim with the turn so far,
    then final once the caller has been quiet 0.8 s, and adds the turn to the conversation as the user's
    message."""

    async def converse() -> tuple[Call, list[UserInputTranscribedEvent]]:
        transcribed: list[UserInputTranscribedEvent] = []
        final = asyncio.Event()

        def on_transcribed(event: UserInputTranscribedEvent) -> None:
            transcribed.append(event)
            if event.is_final:
                final.set()

        async with call(hearing_server.url) as c:
            c.session.on("user_input_transcribed", on_transcribed)
            await c.say(caller.first)
            await asyncio.wait_for(final.wait(), 3)
            await c.played_out()
        return c, transcribed

    c, transcribed = run_asyncio(converse())
    assert [e["error"]["code"] for e in c.model.received_of("error")] == ["unsupported_delegation"]
    assert hearing_server.problems == []
    deltas = c.model.received_of("session.input_transcript.delta")
    assert [d["delta"] for d in deltas] == hearing_server.heard

    # LiveKit's events: the turn so far as each fragment came, then the whole turn, all of one message.
    assert [e.is_final for e in transcribed] == [False] * len(hearing_server.heard) + [True]
    assert [e.transcript.strip() for e in transcribed][-2:] == [hearing_server.heard_text] * 2
    assert len({e.item_id for e in transcribed}) == 1
    said = [item for item in c.items if isinstance(item, llm.ChatMessage) and item.role == "user"]
    assert [(item.text_content or "").strip() for item in said] == [hearing_server.heard_text], said
    assert said[0].id == transcribed[-1].item_id
