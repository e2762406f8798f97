"""`pplex-trio voice` as a user runs it: create a .pt from a clip; add, list and remove a server's voices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import sphn
import torch

from _helpers.process import start_serve

TOKEN = "voice-cli-test-token-1234"


def pplex(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pplex_trio", *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd
    )


def test_create_writes_the_reference_voice_that_both_servers_load(golden_dir, tmp_path):
    out = tmp_path / "Mine.pt"
    proc = pplex(
        "voice",
        "create",
        str(golden_dir / "voices" / "TINY0.wav"),
        "--model",
        str(golden_dir),
        "-o",
        str(out),
        "--device",
        "cpu",
    )
    assert proc.returncode == 0, proc.stderr
    # Loaded the way NVIDIA's server loads a voice (torch.load, then its two keys), beside its own file.
    ours, reference = torch.load(out), torch.load(golden_dir / "voices" / "TINY0.pt")
    assert set(ours) == set(reference) == {"embeddings", "cache"}
    for key in ours:
        assert ours[key].shape == reference[key].shape and ours[key].dtype == reference[key].dtype
    assert torch.allclose(ours["embeddings"], reference["embeddings"], atol=1e-6, rtol=0)
    assert torch.equal(ours["cache"], reference["cache"])
    # And ours runs the golden conversation with it.
    proc = pplex(
        "offline",
        "--model",
        str(golden_dir),
        "--input-wav",
        str(golden_dir / "input.wav"),
        "--output-wav",
        str(tmp_path / "o.wav"),
        "--output-text",
        str(tmp_path / "o.json"),
        "--text-prompt",
        json.loads((golden_dir / "config.json").read_text())["golden"]["text_prompt"],
        "--voice-prompt",
        str(out),
        "--greedy",
        "--device",
        "cpu",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "o.json").read_text()) == json.loads(
        (golden_dir / "expected" / "output_text.json").read_text()
    )


def test_create_says_why_a_clip_cannot_be_a_voice(golden_dir, tmp_path):
    silent = tmp_path / "silent.wav"
    sphn.write_wav(str(silent), np.zeros(48_000, dtype=np.float32), 24_000)
    proc = pplex(
        "voice", "create", str(silent), "--model", str(golden_dir), "-o", str(tmp_path / "x.pt"), "--device", "cpu"
    )
    assert proc.returncode == 1 and "silent or shorter than 0.4 s" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x.pt").exists()
    proc = pplex("voice", "create", str(tmp_path / "none.wav"), "--model", str(golden_dir), "-o", "x.pt")
    assert proc.returncode == 1 and "none.wav: no such file" in proc.stderr


def test_add_list_and_remove_on_a_running_server(golden_dir, tmp_path):
    env = dict(os.environ, PPLEX_TRIO_AUTH_TOKEN=TOKEN)
    server, port, _ = start_serve("--model", "echo", "--voice-store", str(tmp_path / "store"), "--auth-token", TOKEN)
    url = f"http://127.0.0.1:{port}"
    clip = golden_dir / "voices" / "TINY0.wav"
    try:
        added = pplex("voice", "add", str(clip), "--name", "Mine", url, env=env)
        assert added.returncode == 0, added.stderr
        assert added.stdout.strip() == "added Mine.pt (2 s clip)"
        again = pplex("voice", "add", str(clip), "--name", "Mine", url, env=env)
        assert again.returncode == 1 and "server: 409: there is already a voice Mine.pt" in again.stderr
        listed = pplex("voice", "list", url, "--token", TOKEN)
        lines = listed.stdout.splitlines()
        assert "NATF0.pt\tmodel" in lines and lines[-1] == "Mine.pt\tadded"
        no_token = pplex(
            "voice", "list", url, env={k: v for k, v in os.environ.items() if k != "PPLEX_TRIO_AUTH_TOKEN"}
        )
        assert no_token.returncode == 1 and "server: 401" in no_token.stderr
        removed = pplex("voice", "rm", "Mine", url, env=env)
        assert removed.returncode == 0 and removed.stdout.strip() == "deleted Mine.pt"
        gone = pplex("voice", "rm", "Mine", url, env=env)
        assert gone.returncode == 1 and "server: 404" in gone.stderr
        text = pplex("voice", "add", str(golden_dir / "config.json"), "--name", "X", url, env=env)
        assert text.returncode == 1 and "give a .wav, .flac, .mp3 or .ogg clip" in text.stderr
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=10)
        server.stderr.close()
    nowhere = pplex("voice", "list", url, env=env)
    assert nowhere.returncode == 1 and "Traceback" not in nowhere.stderr and "refused" in nowhere.stderr.lower()
