"""Parity with NVIDIA's PersonaPlex reference on the golden tiny checkpoint.

The golden files were produced by the reference itself (see the golden
README); nothing expected here is computed by our code.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import sphn
import torch
import trio
from _model_flows import LMRun, every_part, run_lm

from pplex_trio.engine._interface import Conversation, Sampling, SlotMode
from pplex_trio.engine._personaplex import PersonaPlexEngine
from pplex_trio.model import persona_tokens

GREEDY = Sampling(greedy=True)


@pytest.fixture(scope="module")
def lm_run(golden_model, golden) -> LMRun:
    return run_lm(golden_model, golden, depformer_steps=16)


def test_golden_config_is_read_from_the_checkpoint(golden_model):
    cfg = golden_model.config
    assert (cfg.lm.dim, cfg.lm.dep_q, cfg.lm.context, cfg.lm.card, cfg.lm.text_card) == (64, 16, 64, 64, 128)
    assert cfg.mimi.transformer.context == 50 and cfg.mimi.quantizer.n_q == 16 and cfg.mimi.num_codebooks == 8
    assert cfg.prompt.silence_tokens == (52, 51, 26, 34, 8, 6, 58, 24)
    assert cfg.prompt.sine_tokens == (46, 52, 61, 11, 7, 23, 56, 24)
    assert golden_model.voices.names() == ["TINY0.pt", "TINY0.wav"]


def test_persona_tokens_match(golden_model, golden):
    assert persona_tokens(golden_model.tokenizer, golden.persona) == golden.prompt_tokens


@torch.no_grad()
def test_mimi_streaming_encode_matches_input_codes(golden_model, golden):
    mimi = golden_model.mimi
    state = mimi.init_encoder_state(1)
    codes = [
        mimi.encode_frame(torch.from_numpy(golden.frame(i))[None], state)[0].numpy()
        for i in range(len(golden.input_codes))
    ]
    np.testing.assert_array_equal(np.stack(codes), golden.input_codes)


@torch.no_grad()
def test_mimi_streaming_decode_matches_output_pcm(golden_model, golden):
    mimi = golden_model.mimi
    state = mimi.init_decoder_state(1)
    pcm = [
        mimi.decode_frame(torch.from_numpy(golden.output_tokens[i : i + 1, 1:9]), state)[0].numpy()
        for i in range(len(golden.output_tokens))
    ]
    assert np.abs(np.concatenate(pcm) - golden.output_pcm).max() <= 1e-4


def test_lm_alone_matches_lm_only_trace(lm_run, golden):
    ref = golden.lm_only
    assert np.abs(lm_run.hidden - ref["transformer_out"]).max() < 1e-5
    assert np.abs(lm_run.text_logits - ref["text_logits"]).max() < 1e-5
    # All 16 depformer steps; the reference's last one cannot see step 0 (its ring is full), ours can.
    assert np.abs(lm_run.audio_logits[:, :15] - ref["audio_logits"][:, :15]).max() < 1e-5
    assert np.abs(lm_run.audio_logits[:, 15] - ref["audio_logits"][:, 15]).max() > 1e-3
    np.testing.assert_array_equal(lm_run.tokens[-100:], ref["output_tokens"])


def test_prompt_phases_match_step_log(lm_run, golden):
    log = golden.step_log
    keep = log["phase"] != "warmup"  # the reference warmed up before its reset; we have no warmup
    phase, out, none = log["phase"][keep], log["out"][keep], log["out_is_none"][keep]
    assert len(phase) == len(lm_run.tokens) == 206
    np.testing.assert_array_equal(~lm_run.valid, none)
    np.testing.assert_array_equal(lm_run.tokens[~none], out[~none])
    # The forced inputs of the token steps are the ones the reference logged.
    steps = np.flatnonzero(log["kind"][keep] == "step")
    np.testing.assert_array_equal(
        lm_run.forced[steps, 1:9][phase[steps] != "user"], log["moshi_tokens"][keep][steps][phase[steps] != "user"]
    )
    np.testing.assert_array_equal(lm_run.forced[steps, 9:], log["input_tokens"][keep][steps])
    text = log["text_token"][keep][steps]
    np.testing.assert_array_equal(lm_run.forced[steps, 0][text >= 0], text[text >= 0])
    assert list(phase[:25]) == ["voice"] * 24 + ["silence_after_voice"]


def test_skipping_teacher_forced_depformer_steps_changes_nothing(golden_model, golden, lm_run):
    short = run_lm(golden_model, golden, depformer_steps=8)
    np.testing.assert_array_equal(short.tokens, lm_run.tokens)
    np.testing.assert_array_equal(short.hidden, lm_run.hidden)
    np.testing.assert_array_equal(short.audio_logits, lm_run.audio_logits[:, :8])


def run_engine(
    model,
    golden,
    num_slots: int,
    golden_row: int,
    other_joins_at: int | None = None,
    shortcuts: bool = True,
    chunk: int = 1000,
):
    """The golden conversation in ``golden_row``; optionally another one joins the other row.

    Prompts run through ``engine.prefill`` in calls of at most ``chunk``
    positions per row.  ``other_joins_at``: -1 starts the other conversation
    with the golden one (their prompts run side by side), ``n >= 0`` after
    the golden one's ``n``-th live frame (its prompt then runs between the
    ticks, 5 positions at a time).  ``shortcuts=False`` runs every tick with
    every part on, as the CUDA graph records it.
    """
    engine = PersonaPlexEngine(model, num_slots)
    every_part(engine, on=not shortcuts)
    frames = len(golden.input_codes)
    other = 1 - golden_row
    rng = np.random.RandomState(7)

    def start_other() -> int:
        return engine.start(
            other,
            Conversation(
                persona="You run a small bakery.", voice=golden.voice, sampling=Sampling(text_seed=1, audio_seed=2)
            ),
        )

    prefill = engine.start(golden_row, Conversation(persona=golden.persona, voice=golden.voice, sampling=GREEDY))
    left = {golden_row: prefill} | ({other: start_other()} if other_joins_at == -1 else {})
    while left[golden_row]:
        done = engine.prefill({slot: chunk for slot, n in left.items() if n})
        left = {slot: n - done.get(slot, 0) for slot, n in left.items()}
    pcm_out, tokens, texts = [], [], []
    for i in range(frames):
        if i == other_joins_at:
            left[other] = start_other()
        if left.get(other):
            left[other] -= engine.prefill({other: 5})[other]
        modes = [SlotMode.IDLE] * num_slots
        modes[golden_row] = SlotMode.LIVE
        pcm = np.zeros((num_slots, 1920), np.float32)
        pcm[golden_row] = golden.frame(i)
        if other in left and left[other] == 0:
            modes[other] = SlotMode.LIVE
            pcm[other] = (0.1 * rng.randn(1920)).astype(np.float32)
        out = engine.step(modes, pcm)
        pcm_out.append(out.pcm[golden_row])
        tokens.append(engine.last_tokens[golden_row].copy())
        texts.append(model.tokenizer.offline_piece(int(engine.last_tokens[golden_row, 0])))
    return np.concatenate(pcm_out), np.stack(tokens), texts, prefill


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_engine_reproduces_golden_single_slot(golden_model, golden, chunk):
    """The prompt one position per call (as one step per tick did), in chunks of 7, in as few as the ring
    allows (its 64 positions wrap inside the 106-position prompt)."""
    pcm, tokens, texts, prefill = run_engine(golden_model, golden, 1, 0, chunk=chunk)
    assert prefill == 24 + 6 + 70 + 6
    np.testing.assert_array_equal(tokens, golden.output_tokens)
    assert np.abs(pcm - golden.output_pcm).max() <= 1e-4
    assert texts == golden.output_text


@pytest.mark.parametrize("golden_row,joins,shortcuts", [(0, 20, True), (1, -1, False), (1, 60, True)])
def test_engine_reproduces_golden_beside_another_conversation(golden_model, golden, golden_row, joins, shortcuts):
    """Another conversation prefills beside the golden one (its prompt side by side, or between the golden
    one's live ticks) and then talks beside it: the golden row stays exact.

    With ``shortcuts=False`` every tick runs with every part on: the function ``cuda_graph=True`` records,
    checked here on CPU.
    """
    pcm, tokens, texts, _ = run_engine(
        golden_model, golden, 2, golden_row, other_joins_at=joins, shortcuts=shortcuts, chunk=9
    )
    np.testing.assert_array_equal(tokens, golden.output_tokens)
    assert np.abs(pcm - golden.output_pcm).max() <= 1e-4
    assert texts == golden.output_text


def test_offline_command_reproduces_golden(golden_dir, golden, tmp_path):
    """`pplex-trio offline` as a user runs it, in its own process."""
    import subprocess
    import sys

    wav, text = tmp_path / "out.wav", tmp_path / "out.json"
    persona = json.loads((golden_dir / "config.json").read_text())["golden"]["text_prompt"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pplex_trio",
            "offline",
            "--model",
            str(golden_dir),
            "--input-wav",
            str(golden_dir / "input.wav"),
            "--output-wav",
            str(wav),
            "--output-text",
            str(text),
            "--text-prompt",
            persona,
            "--voice-prompt",
            golden.voice,
            "--greedy",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(text.read_text()) == golden.output_text
    ours, rate = sphn.read(str(wav))
    ref, _ = sphn.read(str(golden_dir / "expected" / "output.wav"))
    assert rate == 24_000 and ours.shape == ref.shape == (1, 192_000)
    assert np.abs(ours - ref).max() * 32768 <= 1.0  # one LSB: float differences of ~1e-7 may cross a step
    assert np.abs(ours[0] - golden.output_pcm).max() <= 1e-4 + 1 / 32767


@pytest.mark.parametrize("voice", ["TINY0.pt", "TINY0.wav"])
async def test_the_golden_conversation_through_a_server_session(
    voice, nursery, autojump_clock, golden_model, golden, monkeypatch
):
    """The whole server path (a raw session, the actor's schedule, the prompt as chunked prefill between
    calls, the ticks) on the golden checkpoint: the reference's audio, frame for frame, with the voice as
    its ``.pt`` or as the recording it was made from (``expected_voicegen/``: the same run)."""
    import json as _json

    from _helpers.fake_ws import running_host, start_session

    engine = PersonaPlexEngine(golden_model, 2)
    host = await running_host(
        monkeypatch, nursery, engine=engine, slots=2, prompt_position_seconds=0.001, first_frame_timeout=3.0
    )  # the first step takes the first frame, as the reference
    run = await start_session(nursery, host, "raw")
    run.ws.client_send(
        _json.dumps(
            {
                "type": "open",
                "text_prompt": golden.persona,
                "voice_prompt": voice,
                "text_temperature": 0,
                "audio_temperature": 0,
            }
        )
    )
    await run.ws.wait_for(lambda sent: any(isinstance(m, str) and '"ready"' in m for m in sent))
    frames = len(golden.input_codes)

    def outputs() -> list[np.ndarray]:
        return [np.frombuffer(m, dtype="<f4") for m in run.ws.sent if isinstance(m, bytes)]

    # Lock-step with the server: two frames ahead, then one per answer, so no tick ever lacks one.
    sent = 0
    while len(outputs()) < frames:
        while sent < min(frames, len(outputs()) + 2):
            run.ws.client_send(golden.frame(sent).tobytes())
            sent += 1
        count = len(outputs())
        await run.ws.wait_for(lambda _: len(outputs()) > count or None)  # noqa: B023 (awaited here)
    pcm = np.concatenate(outputs()[:frames])
    assert np.abs(pcm - golden.output_pcm).max() <= 1e-4
    await trio.sleep(0.2)  # the last frame's text goes out after its audio
    text, seen = "", 0
    for message in run.ws.sent:  # a frame's text follows its audio; the frames after the input's are not ours
        if isinstance(message, bytes):
            seen += 1
            if seen > frames:
                break
        elif '"text"' in message:
            text += _json.loads(message)["text"]
    pieces = [p for p in golden.output_text if p not in ("EPAD", "PAD", "<s>", "</s>")]  # (control pieces: no text)
    assert text == "".join(pieces)
