"""Start `pplex-trio serve` as a child process and read its resource use."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

CLK_TCK = os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """A server on a free port; ``cpu_seconds()`` and ``peak_rss_mb()`` read /proc."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        python: str = sys.executable,
        ready_pattern: str | None = None,
        startup_timeout: float = 120.0,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ):
        self.proc = subprocess.Popen(
            [python, *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
            cwd=cwd,
        )
        self.log: list[str] = []
        pattern = re.compile(ready_pattern or r"Running on http://([\d.]+:\d+)")
        found = threading.Event()
        self.address = ""

        def drain() -> None:  # keep reading so the pipe never fills up
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                match = pattern.search(line)
                if match and not found.is_set():
                    self.address = match.group(1)
                    found.set()

        self._reader = threading.Thread(target=drain, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + startup_timeout
        while not found.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server did not start:\n" + "".join(self.log[-30:]))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process and its threads (not its children)."""
        return _cpu_seconds(self.pid)

    def tree_cpu_seconds(self) -> float:
        """The same with its live child processes (the Opus encoder child): the whole server's CPU."""
        return sum(_cpu_seconds(pid) for pid in [self.pid, *_descendants(self.pid)])

    def peak_rss_mb(self) -> float:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reader.join(timeout=2)
        if not self._reader.is_alive() and self.proc.stderr is not None:
            self.proc.stderr.close()
        return self.proc.returncode


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:  # a child that has just ended
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _descendants(pid: int) -> list[int]:
    children: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(child) for child in f.read().split()]
    except FileNotFoundError:
        return []
    return children + [grandchild for child in children for grandchild in _descendants(child)]
