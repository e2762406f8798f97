"""`/v1/realtime` with the official `openai` SDK as a real third-party client, GA and beta.

Every event the server sends is validated against the SDK's own
``RealtimeServerEvent`` union (the SDK does not validate what it receives).
The echo engine returns the caller's audio one frame later, so what comes
back must correlate with what was sent, through PCM16 and through μ-law.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from _helpers.browser import ThreadServer
from pplex_trio.engine import EchoEngine
from pplex_trio.server import ServerSettings

openai = pytest.importorskip("openai")
from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent  # noqa: E402
from openai.types.realtime import RealtimeServerEvent as ServerEvent  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # the independent μ-law reference

VALIDATORS = {False: TypeAdapter(ServerEvent), True: TypeAdapter(BetaServerEvent)}
TOKEN = "sdk-token-0c7e1b9a4f"


@pytest.fixture
def server() -> Iterator[Any]:
    servers: list[ThreadServer] = []

    def start(engine: Any = None, **overrides: Any) -> ThreadServer:
        options = dict(host="127.0.0.1", port=0, slots=2)
        options.update(overrides)
        settings = ServerSettings(**options)
        engine = engine or EchoEngine(settings.slots, delay_frames=1, prefill_steps=4)
        servers.append(ThreadServer(settings, engine).start())
        return servers[-1]

    yield start
    for running in servers:
        running.stop()


_clients: list[Any] = []


def sdk_client(server: ThreadServer, api_key: str = "unused") -> Any:
    base = server.url + "/v1"
    # The beta client goes to wss:// unless told the WebSocket address.
    client = openai.OpenAI(api_key=api_key, base_url=base, websocket_base_url=base.replace("http", "ws", 1))
    _clients.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().close()


def realtime(client: Any, beta: bool) -> Any:
    return (client.beta.realtime if beta else client.realtime).connect(model="personaplex")


class Recorder:
    """Every event of a connection, validated as it arrives; audio streamed in real time beside it."""

    def __init__(self, connection: Any, beta: bool):
        self.connection = connection
        self.beta = beta
        self.events: list[dict] = []

    def next(self, timeout: float = 10.0) -> dict:
        event = json.loads(self.connection.recv_bytes())
        if not event["type"].startswith("pplex."):  # our documented queue event is not OpenAI's
            VALIDATORS[self.beta].validate_python(event)
        self.events.append(event)
        return event

    def until(self, kind: str, limit: int = 10_000) -> dict:
        for _ in range(limit):
            event = self.next()
            if event["type"] == kind:
                return event
        raise AssertionError(f"no {kind} in {limit} events")

    def stream(self, chunks: list[bytes], seconds_after: float) -> None:
        """Send ``chunks`` (one per 80 ms) in real time and record until ``seconds_after`` past the last."""

        def send() -> None:
            started = time.monotonic()
            for i, chunk in enumerate(chunks):
                self.connection.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
                time.sleep(max(0.0, started + (i + 1) * 0.08 - time.monotonic()))

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + len(chunks) * 0.08 + seconds_after
        while time.monotonic() < deadline:
            self.next()
        sender.join()

    def of(self, *kinds: str) -> list[dict]:
        return [e for e in self.events if e["type"] in kinds]


def tone(rate: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t) * np.minimum(1, t * 4)).astype(np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    return (samples * 32767).astype("<i2").tobytes()


def best_correlation(sent: np.ndarray, received: np.ndarray, max_lag: int) -> float:
    """How well ``received`` echoes ``sent``: per received frame that carries sound, its best correlation with
    a stretch of ``sent`` (within ``max_lag`` of where it would be), the median of them.  On the real clock a
    client's late page puts a frame of silence into the echo, which shifts the rest: each frame is found on
    its own, so that shift costs nothing, while a garbled stream still scores low."""
    frame = max_lag // 12
    scores = []
    for start in range(0, received.size - frame + 1, frame):
        chunk = received[start : start + frame]
        if np.sqrt(np.mean(chunk**2)) < 0.05:
            continue  # (the fade-in, and a silent frame put in for a late page)
        lags = range(max(0, start - max_lag), min(sent.size - frame, start) + 1, 4)
        scores.append(max(float(np.corrcoef(chunk, sent[lag : lag + frame])[0, 1]) for lag in lags))
    assert len(scores) >= received.size // frame // 2, "less than half the echo carries the tone"
    return float(np.median(scores))


def check_tiling(events: list[dict], beta: bool) -> None:
    """Every delta belongs to a response that was created and is not yet done."""
    audio = "response.audio.delta" if beta else "response.output_audio.delta"
    text = "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta"
    open_responses: set[str] = set()
    for event in events:
        if event["type"] == "response.created":
            open_responses.add(event["response"]["id"])
        elif event["type"] == "response.done":
            open_responses.remove(event["response"]["id"])
        elif event["type"] in (audio, text):
            assert event["response_id"] in open_responses, event["type"]


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_the_sdk_talks_pcm16_with_the_echo(server, beta):
    running = server()
    with realtime(sdk_client(running), beta) as connection:
        recorder = Recorder(connection, beta)
        created = recorder.until("session.created")["session"]
        assert created["instructions"] == ""
        if beta:
            connection.session.update(
                session={
                    "instructions": "Be kind.",
                    "voice": "NATF2.pt",
                    "input_audio_format": "pcm16",
                    "output_audio_format": "pcm16",
                }
            )
        else:
            connection.session.update(
                session={
                    "type": "realtime",
                    "instructions": "Be kind.",
                    "audio": {
                        "input": {"format": {"type": "audio/pcm", "rate": 24000}},
                        "output": {"voice": "NATF2.pt"},
                    },
                }
            )
        updated = recorder.until("session.updated")["session"]
        assert updated["instructions"] == "Be kind."
        assert (updated["voice"] if beta else updated["audio"]["output"]["voice"]) == "NATF2.pt"
        sent = tone(24_000, 2.4)
        recorder.stream([pcm16(sent[i : i + 1920]) for i in range(0, sent.size, 1920)], seconds_after=1.0)
        session = running.get("/api/sessions")["sessions"][0]
        assert session["protocol"] == "realtime" and session["frames_decoded"] >= 20
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    transcript = "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta"
    audio = np.concatenate([np.frombuffer(base64.b64decode(e["delta"]), "<i2") for e in recorder.of(delta)])
    assert all(len(base64.b64decode(e["delta"])) == 1920 * 2 for e in recorder.of(delta))  # a frame each
    assert best_correlation(sent, audio.astype(np.float32) / 32768, 12 * 1920) > 0.95
    pieces = [e["delta"] for e in recorder.of(transcript)]
    assert len(pieces) >= 20 and pieces == [f" {i}" for i in range(len(pieces))]
    assert recorder.of("input_audio_buffer.speech_started")
    check_tiling(recorder.events, beta)


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_the_sdk_talks_mu_law_at_8_khz(server, beta):
    running = server()
    with realtime(sdk_client(running), beta) as connection:
        recorder = Recorder(connection, beta)
        recorder.until("session.created")
        if beta:
            connection.session.update(session={"input_audio_format": "g711_ulaw", "output_audio_format": "g711_ulaw"})
        else:
            connection.session.update(
                session={
                    "type": "realtime",
                    "audio": {
                        "input": {"format": {"type": "audio/pcmu"}},
                        "output": {"format": {"type": "audio/pcmu"}},
                    },
                }
            )
        recorder.until("session.updated")
        sent = tone(8_000, 2.4, hz=700.0)
        ulaw = audioop.lin2ulaw(pcm16(sent), 2)  # encoded by the reference, not by our codec
        recorder.stream([ulaw[i : i + 640] for i in range(0, len(ulaw), 640)], seconds_after=1.0)
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    received = b"".join(base64.b64decode(e["delta"]) for e in recorder.of(delta))
    decoded = np.frombuffer(audioop.ulaw2lin(received, 2), "<i2").astype(np.float32) / 32768
    assert 0.8 * 640 * len(recorder.of(delta)) <= decoded.size <= 640 * len(recorder.of(delta))  # 8 kHz out
    assert best_correlation(sent, decoded, 12 * 640) > 0.9
    check_tiling(recorder.events, beta)


def test_bad_events_get_errors_and_the_session_goes_on(server):
    running = server(max_prompt_chars=40)
    with realtime(sdk_client(running), False) as connection:
        recorder = Recorder(connection, False)
        recorder.until("session.created")
        bad: list[tuple[Any, str | None]] = [
            (
                {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "nova2"}}}},
                "session.audio.output.voice",
            ),
            (
                {"type": "session.update", "session": {"type": "realtime", "instructions": "x" * 41}},
                "session.instructions",
            ),
            (
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}},
                    },
                },
                "session.audio.input.format",
            ),
            ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "audio"),
            ({"type": "conversation.item.create", "item": {"type": "message"}}, "item.role"),
            ("{not json", None),
        ]
        for event, param in bad:
            if isinstance(event, dict):
                connection.send(event)
            else:
                connection.send_raw(event)
            error = recorder.until("error")["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error", error
        connection.session.update(session={"type": "realtime", "instructions": "Fine now."})
        assert recorder.until("session.updated")["session"]["instructions"] == "Fine now."
        recorder.stream([pcm16(tone(24_000, 0.08))] * 10, seconds_after=0.5)
        assert recorder.of("response.output_audio.delta")  # the conversation went on
        connection.session.update(session={"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}})
        error = recorder.until("error")["error"]
        assert error["code"] == "session_started" and error["param"] == "session.input_format"


def test_the_sdk_api_key_carries_the_token(server):
    running = server(auth_token=TOKEN)
    with realtime(sdk_client(running, api_key=TOKEN), False) as connection:
        assert Recorder(connection, False).until("session.created")
    with pytest.raises(Exception) as refused, realtime(sdk_client(running, api_key="wrong"), False):
        pass
    assert "401" in str(refused.value)


def test_v1_models_lists_the_served_model(server):
    running = server()
    models = sdk_client(running).models.list()
    assert [model.id for model in models.data] == ["echo"]


@pytest.fixture(scope="module")
def tiny_engine() -> Any:
    from pplex_trio.engine._personaplex import PersonaPlexEngine

    return PersonaPlexEngine.load("tiny", num_slots=1)


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_the_sdk_with_the_tiny_model(server, tiny_engine, beta):
    tiny_engine.reset_all()
    running = server(engine=tiny_engine, slots=1, model="tiny")
    with realtime(sdk_client(running), beta) as connection:
        recorder = Recorder(connection, beta)
        recorder.until("session.created")
        persona = "You are a pirate captain."
        connection.session.update(
            session={"instructions": persona, "voice": "NATM1.pt"}
            if beta
            else {"type": "realtime", "instructions": persona, "audio": {"output": {"voice": "NATM1.pt"}}}
        )
        recorder.until("session.updated")
        connection.response.create()
        recorder.until("response.created")  # live: the tiny model has run the persona and the voice
        recorder.stream([pcm16(tone(24_000, 0.08))] * 12, seconds_after=0.5)
    delta = "response.audio.delta" if beta else "response.output_audio.delta"
    frames = recorder.of(delta)
    assert len(frames) >= 8 and all(len(base64.b64decode(e["delta"])) == 3840 for e in frames)
    assert any(np.frombuffer(base64.b64decode(e["delta"]), "<i2").any() for e in frames)  # the model's voice
    check_tiling(recorder.events, beta)
