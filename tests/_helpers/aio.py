"""Running an asyncio client from a test of the Trio suite."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


def run_asyncio(coroutine: Any) -> Any:
    """``asyncio.run(coroutine)`` on a thread of its own; its result, or its exception raised here."""
    outcome: dict[str, Any] = {}

    def main() -> None:
        try:
            outcome["result"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 (handed to the test's thread)
            outcome["error"] = exc

    thread = threading.Thread(target=main, name="asyncio-client")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
