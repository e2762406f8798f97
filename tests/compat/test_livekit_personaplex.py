"""LiveKit's PersonaPlex plugin (``livekit-plugins-nvidia``) against ``/api/chat`` on the echo.

The plugin speaks the Moshi protocol as NVIDIA's own server does: persona,
voice and ``seed`` in the query, Ogg Opus both ways, audio sent from the
handshake on. Its ``RealtimeSession`` is driven as an ``AgentSession`` drives
it, without a room: the room's microphone track goes in as 10 ms frames at
48 kHz (the plugin resamples and encodes), what the model says is read from
each generation's streams. When the caller speaks over the model the agent
interrupts (the plugin has no truncation: it ends the generation it was
playing and the next audio opens another), and a new persona
(``update_instructions``) makes the plugin reconnect with it in the query.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import urllib.parse

import numpy as np
import pytest
import sphn

pytest.importorskip("livekit.plugins.nvidia.experimental.realtime")

from livekit import rtc  # noqa: E402
from livekit.agents import llm  # noqa: E402
from livekit.plugins.nvidia.experimental import realtime  # noqa: E402

from _helpers.aio import run_asyncio

logger = logging.getLogger(__name__)

ROOM_RATE = 48_000
CHUNK_MS = 10
PERSONA = "You are a friendly assistant. Keep your answers short."
NEW_PERSONA = "You work at a bakery. Be brief and warm."


@dataclasses.dataclass
class Loudspeaker:
    """Every generation's audio and text, with when each piece came."""

    audio: list[tuple[float, np.ndarray]] = dataclasses.field(default_factory=list)
    text: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    generations: list[tuple[float, llm.GenerationCreatedEvent]] = dataclasses.field(default_factory=list)
    readers: list[asyncio.Task] = dataclasses.field(default_factory=list)

    def on_generation(self, generation: llm.GenerationCreatedEvent) -> None:
        self.generations.append((time.monotonic(), generation))
        self.readers.append(asyncio.create_task(self._read(generation)))

    async def _read(self, generation: llm.GenerationCreatedEvent) -> None:
        async for message in generation.message_stream:

            async def audio(message=message):
                async for frame in message.audio_stream:
                    assert (frame.sample_rate, frame.num_channels) == (24_000, 1)
                    pcm = np.frombuffer(bytes(frame.data), "<i2").astype(np.float32) / 32768
                    self.audio.append((time.monotonic(), pcm))

            async def text(message=message):
                async for piece in message.text_stream:
                    self.text.append((time.monotonic(), str(piece)))

            await asyncio.gather(audio(), text())

    def samples(self, since: float = 0.0, until: float = float("inf")) -> np.ndarray:
        return np.concatenate([pcm for at, pcm in self.audio if since < at < until])

    def numbers(self, since: float = 0.0, until: float = float("inf")) -> list[int]:
        return [int(piece) for at, piece in self.text if since < at < until]


@dataclasses.dataclass
class Run:
    speaker: Loudspeaker
    errors: list[llm.RealtimeModelError]
    interrupted_at: float
    reconnected_at: float  # when the plugin said it had reconnected with the new persona
    close_took: float
    sockets: list


async def talk(session: realtime.RealtimeSession, audio: np.ndarray) -> None:
    """Push ``audio`` (48 kHz float32) as a room's microphone track does, in real time."""
    size = ROOM_RATE * CHUNK_MS // 1000
    pcm = (np.clip(audio, -1, 32767 / 32768) * 32768).astype("<i2")
    started = time.monotonic()
    for n in range(pcm.size // size):
        chunk = pcm[n * size : (n + 1) * size]
        session.push_audio(
            rtc.AudioFrame(data=chunk.tobytes(), sample_rate=ROOM_RATE, num_channels=1, samples_per_channel=size)
        )
        await asyncio.sleep(max(0.0, started + (n + 1) * CHUNK_MS / 1000 - time.monotonic()))


async def converse(ws_url: str, line, recording_http) -> Run:
    http, sockets = recording_http()
    model = realtime.RealtimeModel(base_url=ws_url, voice="NATF2", text_prompt=PERSONA, seed=42, http_session=http)
    session = model.session()
    speaker = Loudspeaker()
    errors: list[llm.RealtimeModelError] = []
    reconnected = asyncio.Event()
    session.on("generation_created", speaker.on_generation)
    session.on("error", errors.append)
    session.on("session_reconnected", lambda _event: reconnected.set())

    async def live(since: float) -> None:
        """Until the model speaks (silence at first): the conversation is live and hears what comes next.

        The plugin holds the microphone's audio until the server's handshake and
        then sends it all at once; a server that keeps to real time keeps only
        the newest of such a burst. A caller waits until the call has connected.
        """
        while not [at for at, _ in speaker.generations if at > since]:
            await asyncio.sleep(0.02)

    try:
        # The caller's line; at the second utterance the agent, hearing the caller, interrupts the model.
        await asyncio.wait_for(live(0.0), 10)
        room = line.at(ROOM_RATE)
        cut = int(line.second_starts * ROOM_RATE)
        await talk(session, room[:cut])
        interrupted_at = time.monotonic()
        session.interrupt()
        await talk(session, room[cut:])

        # A new persona: the plugin reconnects with it; the caller says the start of the first utterance again.
        await session.update_instructions(NEW_PERSONA)
        await asyncio.wait_for(reconnected.wait(), 5)
        reconnected_at = time.monotonic()
        await asyncio.wait_for(live(reconnected_at), 10)
        again = line.at(ROOM_RATE)[: int(1.5 * ROOM_RATE)]
        await talk(session, np.concatenate([again, np.zeros(ROOM_RATE // 2, np.float32)]))
    except BaseException:  # a failed run leaves nothing open for the next test's garbage collector to find
        await session.aclose()
        await http.close()
        raise
    closing = time.monotonic()
    await session.aclose()
    close_took = time.monotonic() - closing
    await asyncio.wait_for(asyncio.gather(*speaker.readers), 2)
    await http.close()
    return Run(speaker, errors, interrupted_at, reconnected_at, close_took, sockets)


def opus_twice(pcm: np.ndarray) -> np.ndarray:
    """``pcm`` (24 kHz) through Opus twice, as the plugin's encoder and the server's code it: sphn, locally."""
    pcm = np.concatenate([pcm, np.zeros(4800, np.float32)])  # room for the codec's delay
    for _ in range(2):
        writer, reader = sphn.OpusStreamWriter(24_000), sphn.OpusStreamReader(24_000)
        pcm = np.concatenate(
            [reader.append_bytes(writer.append_pcm(pcm[i : i + 1920])) for i in range(0, pcm.size - 1919, 1920)]
        )
    return pcm


@pytest.mark.serial  # the plugin's reconnect waits on a new system prompt in real time: it needs the CPU
def test_livekit_personaplex_plugin_hears_the_echo(echo_server, caller, assert_echoed, recording_http, caplog):
    before, mark = echo_server.ended("moshi"), len(echo_server.log)
    caplog.set_level(logging.DEBUG, logger="livekit.plugins.nvidia")
    run = run_asyncio(converse(echo_server.ws_url, caller, recording_http))

    assert not run.errors, [error.error for error in run.errors]
    assert echo_server.problems_since(mark) == []
    # A program gets WebSocket pings, never the browser's 0x06 keepalive (the plugin knows no such message).
    complaints = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert complaints == []

    # Two connections: the first persona, then the new one, with the plugin's voice and seed both times.
    first, second = (urllib.parse.parse_qs(urllib.parse.urlsplit(socket.url).query) for socket in run.sockets)
    assert first == {"voice_prompt": ["NATF2.pt"], "text_prompt": [PERSONA], "seed": ["42"]}
    assert second == {"voice_prompt": ["NATF2.pt"], "text_prompt": [NEW_PERSONA], "seed": ["42"]}

    # What came back is the caller's speech, through Opus twice (the plugin's encoder, the server's): each
    # half second must score what two local passes of sphn's Opus leave of it (0.8-0.96), less 0.05.
    before_reconnect = run.speaker.samples(until=run.reconnected_at)
    assert_echoed(caller.first, before_reconnect, opus_twice)
    assert_echoed(caller.second, before_reconnect, opus_twice)

    # The barge-in: the agent interrupted the model; the plugin opened a new generation with the next
    # audio, on the same connection, and the caller's second utterance came back after it.
    after = [at for at, _ in run.speaker.generations if run.interrupted_at < at < run.reconnected_at]
    assert after, "no audio came after the interruption"
    assert_echoed(
        caller.second[caller.second.size // 2 :],
        run.speaker.samples(since=run.interrupted_at, until=run.reconnected_at),
        opus_twice,
    )

    # With the new persona, a new conversation: the echo again, and its frame numbers from 0 again.
    assert_echoed(caller.first[: int(1.5 * 24_000)], run.speaker.samples(since=run.reconnected_at), opus_twice)
    for numbers in (run.speaker.numbers(until=run.reconnected_at), run.speaker.numbers(since=run.reconnected_at)):
        assert numbers[0] == 0 and numbers == list(range(len(numbers))), numbers

    # Clean closes, both (the persona change's and the end's): the server answered each close frame (the
    # plugin waits for the answer: 1006 had there been none), aclose returned at once, and the server
    # counted both conversations as closed by the client.
    assert [socket.close_code for socket in run.sockets] == [1000, 1000]
    assert run.close_took < 1.0, run.close_took
    echo_server.wait_closed("moshi", before, count=2)
    logger.info(
        "livekit personaplex: %d audio pieces, %d generations, close in %.3f s",
        len(run.speaker.audio),
        len(run.speaker.generations),
        run.close_took,
    )
