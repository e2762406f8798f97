"""``pplex-trio serve`` as a child process: the real command, for tests of signals and deployment."""

from __future__ import annotations

import os
import re
import subprocess
import sys

_RUNNING = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")


def start_serve(*args: str, new_session: bool = False) -> tuple[subprocess.Popen[str], int, list[str]]:
    """Start ``pplex-trio serve --port 0 ARGS``; return the process, its port and the log lines read so far.

    Its stderr is read up to the line that gives the port; the caller closes
    ``proc.stderr`` (and may read on). ``new_session``: its own process group,
    so that a test can signal the server and its encoder child together.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "pplex_trio", "serve", "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        start_new_session=new_session,
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if match := _RUNNING.search(line):
            return proc, int(match.group(1)), lines
    proc.wait()
    proc.stderr.close()
    raise RuntimeError("the server did not start:\n" + "".join(lines))
