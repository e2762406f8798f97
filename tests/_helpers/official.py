"""A fake Hugging Face cache holding an official-client ``dist.tgz``, and a server process using it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pathlib
import re
import signal
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator, Mapping

REPO_ID = "nvidia/personaplex-7b-v1"

# A stand-in for the official Vite build: absolute /assets/ paths, and a script
# that shows where the page thinks it is (the real client's router only knows "/").
FAKE_INDEX = """<!doctype html>
<html lang="en">
  <head>
    <meta charset="UTF-8" />
    <title>official client</title>
    <script type="module" crossorigin src="/assets/index-abc123.js"></script>
  </head>
  <body><div id="root"></div></body>
</html>
"""
FAKE_APP_JS = 'document.title = "official client at " + location.pathname + location.search;\n'


def make_tgz(files: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def fake_dist_files() -> dict[str, bytes]:
    return {"dist/index.html": FAKE_INDEX.encode(), "dist/assets/index-abc123.js": FAKE_APP_JS.encode()}


def fake_hub_cache(root: pathlib.Path, archive: bytes, repo: str = REPO_ID) -> pathlib.Path:
    """Lay out ``root`` as the hub cache does: blobs/, refs/main, snapshots/<commit>/dist.tgz → blob."""
    folder = root / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(archive).hexdigest()
    blob = folder / "blobs" / hashlib.sha256(archive).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(archive)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "dist.tgz").symlink_to(os.path.relpath(blob, snapshot))
    return root


@contextlib.contextmanager
def server_process(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60, lines: list[str] | None = None
) -> Iterator[str]:
    """``pplex-trio serve --port 0 ARGS`` in a child process; yields its base URL (``lines``: its stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pplex_trio", "serve", "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    lines = [] if lines is None else lines
    found = threading.Event()
    url: list[str] = []

    def read() -> None:  # keep draining stderr so the server never blocks on it
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            match = re.search(r"Running on (https?://127\.0\.0\.1:\d+)", line)
            if match and not found.is_set():
                url.append(match.group(1))
                found.set()
        found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not found.wait(timeout) or not url:
            raise RuntimeError("server did not start:\n" + "".join(lines))
        yield url[0]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        assert proc.stderr is not None
        proc.stderr.close()
