"""How busy *other* processes keep this machine while the benchmark measures.

The development machines are two shared cores, and other people's test runs
come and go.  A server whose model step takes 40-55 ms out of an 80 ms frame
falls behind as soon as a browser test takes a core, so every scenario
records the cores that processes other than the benchmark and its servers
used meanwhile (``/proc/stat`` busy time minus our own CPU time), and the
benchmark can wait for a quiet moment before each scenario.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable

from _serverproc import CLK_TCK, ServerProcess

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Sample:
    at: float  # time.monotonic()
    busy: float  # CPU seconds the whole machine spent outside idle and iowait
    own: float  # CPU seconds of this process and the servers


def machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class CpuMeter:
    """Samples machine and own CPU time; ``servers()`` gives the server processes alive now."""

    def __init__(self, servers: Callable[[], Iterable[ServerProcess]]):
        self.servers = servers

    def sample(self) -> Sample:
        times = os.times()
        own = times.user + times.system + sum(s.cpu_seconds() for s in self.servers())
        return Sample(time.monotonic(), machine_busy_seconds(), own)

    @staticmethod
    def other_cores(before: Sample, after: Sample) -> float:
        """Cores used by everything else between two samples (never below 0: the clocks tick in 10 ms)."""
        wall = after.at - before.at
        return max(0.0, (after.busy - before.busy) - (after.own - before.own)) / wall if wall > 0 else 0.0

    def wait_quiet(self, below: float, max_wait: float, window: float = 2.0) -> float:
        """Wait until others use under ``below`` cores over ``window`` s (at most ``max_wait`` s); return the last
        reading."""
        deadline = time.monotonic() + max_wait
        while True:
            before = self.sample()
            time.sleep(window)
            cores = self.other_cores(before, self.sample())
            if cores < below:
                return cores
            if time.monotonic() >= deadline:
                logger.warning("other processes still use %.2f cores; measuring anyway", cores)
                return cores
            logger.info("other processes use %.2f cores; waiting for a quieter moment", cores)
