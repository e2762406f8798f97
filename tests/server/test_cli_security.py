"""The command line with every security feature on: `serve --ssl` with a token from the environment,
and `client` over wss:// with --insecure, --cafile and --token."""

from __future__ import annotations

import os
import re
import ssl
import stat
import subprocess
import sys
import time

import httpx
import pytest

from _helpers.official import server_process

TOKEN = "cli-token-3b8d1f0a6c2e4"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pplex_trio", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def secured(tmp_path):
    """`pplex-trio serve --ssl DIR` with PPLEX_TRIO_AUTH_TOKEN set: its URL, its stderr lines, DIR."""
    lines: list[str] = []
    folder = tmp_path / "tls"
    with server_process(
        "--model", "echo", "--ssl", str(folder), env={"PPLEX_TRIO_AUTH_TOKEN": TOKEN}, lines=lines
    ) as url:
        yield url, lines, folder
    assert not any(TOKEN in line for line in lines), "the token reached the server's log"


def test_serve_with_ssl_makes_the_certificate_and_says_where_to_go(secured):
    url, lines, folder = secured
    assert url.startswith("https://")
    assert stat.S_IMODE((folder / "key.pem").stat().st_mode) == 0o600
    deadline = time.monotonic() + 10  # the lines after "Running on" are still on their way
    while not any("open https://" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.02)
    log = "".join(lines)
    fingerprint = re.search(r"SHA-256 fingerprint ((?:[0-9A-F]{2}:){31}[0-9A-F]{2})", log)
    assert fingerprint, log
    assert re.search(r"open https://127\.0\.0\.1:\d+/ \(the certificate is self-signed", log), log
    with httpx.Client(verify=ssl.create_default_context(cafile=folder / "cert.pem")) as http:
        assert http.get(url + "/health").status_code == 200
        assert http.get(url + "/api/info").status_code == 401  # the token from the environment is on
        assert http.get(url + "/api/info", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_the_client_over_wss(secured, golden_dir, tmp_path):
    url, _, folder = secured
    wav = str(golden_dir / "input.wav")
    common = ["client", url, "--input", wav, "--output", str(tmp_path / "out.wav")]
    untrusted = run(*common, "--token", TOKEN)
    assert untrusted.returncode == 1
    assert "certificate" in untrusted.stderr and "--cafile" in untrusted.stderr and "--insecure" in untrusted.stderr
    no_token = run(*common, "--insecure", env={"PPLEX_TRIO_AUTH_TOKEN": ""})
    assert no_token.returncode == 1 and "refused the connection (401)" in no_token.stderr
    assert TOKEN not in no_token.stderr
    by_flag = run(*common, "--insecure", "--token", TOKEN, "--protocol", "raw")
    assert by_flag.returncode == 0, by_flag.stderr
    by_environment = run(*common, "--cafile", str(folder / "cert.pem"), env={"PPLEX_TRIO_AUTH_TOKEN": TOKEN})
    assert by_environment.returncode == 0, by_environment.stderr
    assert (tmp_path / "out.wav").stat().st_size > 100_000


@pytest.mark.parametrize(
    "args, message",
    [
        (["--certfile", "c.pem"], "--certfile and --keyfile go together"),
        (["--allowed-origins", "example.com"], "is not an origin"),
        (["--auth-token", " "], "is empty"),
        (["--max-connections-per-ip", "-1"], "must be at least 0"),
        (["--ssl", "/proc/no-such-place/tls"], "--ssl /proc/no-such-place/tls"),
    ],
)
def test_security_flags_are_checked_with_one_line(args, message):
    result = run("serve", "--model", "echo", "--port", "0", *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
