"""What a real-clock server in the test's process logged as a problem during one test."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

# The actor's warning when it skips ahead: a real-clock server beside the suite on a busy machine may; its timing
# is the benchmarks' to measure, and what each end heard is the tests'.
LATE_TICK = re.compile(r"engine actor fell \d+ tick\(s\) behind")


@contextlib.contextmanager
def captured_problems() -> Iterator[list[str]]:
    """What ``pplex_trio`` logs at WARNING and up inside the block, but a late tick (``LATE_TICK``)."""
    problems: list[str] = []

    class Problems(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not LATE_TICK.search(record.getMessage()):
                problems.append(self.format(record))

    handler = Problems(logging.WARNING)
    logging.getLogger("pplex_trio").addHandler(handler)
    try:
        yield problems
    finally:
        logging.getLogger("pplex_trio").removeHandler(handler)
