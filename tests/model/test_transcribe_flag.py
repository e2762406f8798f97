"""``--transcribe``: what each value loads beside which model, and a named transcriber that cannot be had."""

from __future__ import annotations

import logging

import pytest

from pplex_trio._cli._engines import ModelUnavailable, create_engine, resolve_transcriber
from pplex_trio.server import ServerSettings


@pytest.mark.parametrize(
    "transcribe,model,device,expected",
    [
        ("auto", "nvidia/personaplex-7b-v1", "cuda", ("kyutai/stt-1b-en_fr", False)),  # fit decides, at load
        ("auto", "nvidia/personaplex-7b-v1", "cpu", (None, False)),
        ("auto", "tiny", "cuda", (None, False)),  # the default runs stay as they were
        ("auto", "echo:delay=2", "cpu", (None, False)),
        ("off", "nvidia/personaplex-7b-v1", "cuda", (None, False)),
        ("tiny", "tiny", "cpu", ("tiny-stt", True)),
        ("kyutai/stt-2.6b-en", "tiny", "cpu", ("kyutai/stt-2.6b-en", True)),
        ("./my-stt", "nvidia/personaplex-7b-v1", "cuda:1", ("./my-stt", True)),
    ],
)
def test_what_each_value_loads(transcribe, model, device, expected):
    assert resolve_transcriber(transcribe, model, device) == expected


def test_auto_says_why_it_is_off(caplog):
    with caplog.at_level(logging.INFO):
        resolve_transcriber("auto", "tiny", "cpu")
    assert [r.message for r in caplog.records if "--transcribe auto: off (the tiny model)" in r.message]


def test_the_default_is_auto_and_the_tiny_pair_serves(_private_cache):
    assert ServerSettings().transcribe == "auto"
    engine = create_engine(ServerSettings(model="tiny", slots=1, device="cpu", transcribe="tiny"))
    assert engine.transcript_delay == 0.5
    assert create_engine(ServerSettings(model="tiny", slots=1, device="cpu")).transcript_delay is None


@pytest.mark.parametrize(
    "model,transcribe,problem",
    [
        ("tiny", "./no-such-stt", "no-such-stt"),
        ("echo", "tiny", "the echo test engine has no transcriber; use --transcribe off"),
    ],
)
def test_a_transcriber_asked_for_by_name_that_cannot_be_had_stops_the_server(
    _private_cache, model, transcribe, problem
):
    with pytest.raises(ModelUnavailable) as info:
        create_engine(ServerSettings(model=model, slots=1, device="cpu", transcribe=transcribe))
    message = str(info.value)
    assert message.startswith(f"--transcribe {transcribe}: ") and problem in message and "\n" not in message


def test_offline_writes_the_callers_words_beside_the_agents(_private_cache, speech_wav, tmp_path):
    import argparse
    import json

    import sphn

    from pplex_trio._cli import _offline

    pcm, rate = sphn.read(str(speech_wav))
    wav = tmp_path / "in.wav"
    sphn.write_wav(str(wav), pcm[0, : 6 * rate], rate)
    parser = argparse.ArgumentParser()
    _offline.add_arguments(parser)
    common = ["--model", "tiny", "--input-wav", str(wav), "--output-wav", str(tmp_path / "out.wav"), "--greedy"]
    args = parser.parse_args([*common, "--output-text", str(tmp_path / "out.json"), "--transcribe", "tiny"])
    assert _offline.run(args) == 0
    heard = json.loads((tmp_path / "out.heard.json").read_text())
    agent = json.loads((tmp_path / "out.json").read_text())
    assert heard["model"] == "tiny-stt" and heard["delay_s"] == 0.5
    assert len(heard["tokens"]) == len(heard["end_of_turn"]) == len(agent) == 75
    assert all(0.0 <= p <= 1.0 for p in heard["end_of_turn"])
    words = heard["words"]
    assert words and all(w["text"] and 0.0 <= w["start"] <= w["end"] <= 6.0 for w in words)
    assert all(a["start"] <= b["start"] for a, b in zip(words, words[1:]))
    # Without --transcribe nothing more is written, and the agent's text is the same.
    args = parser.parse_args([*common, "--output-text", str(tmp_path / "alone.json")])
    assert _offline.run(args) == 0
    assert json.loads((tmp_path / "alone.json").read_text()) == agent
    assert not (tmp_path / "alone.heard.json").exists()
