"""bench/fault_times: how long the server takes to let go of a misbehaving client, and to shut down.

Usage (from the repository root)::

    python bench/fault_times.py --client-timeout 5

For each way a live client can misbehave at the transport level (stop reading
with a small receive buffer, freeze, reset, endless fragments, a frame header
claiming a gigabyte), on both protocols: the seconds from the misbehaviour to
the moment its session is gone and its slot free, while a witness
conversation streams beside it (and must get every frame back).  Then the
seconds a shutdown takes with a frozen and a non-reading client connected.
Writes ``bench/results/NAME.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import trio

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from _helpers.bad_client import BadClient, frame_header, masked_frame  # noqa: E402
from _helpers.ws import RawWitness  # noqa: E402
from pplex_trio.engine import EchoEngine  # noqa: E402
from pplex_trio.server import ServerSettings, serve  # noqa: E402

PATHS = {"raw": "/v1/audio/duplex", "moshi": "/api/chat?voice_prompt=NATF0.pt"}
BEHAVIOURS = ("stop_reading", "freeze", "reset", "fragments", "header_only")


async def live_client(port: int, protocol: str, behaviour: str) -> BadClient:
    client = await BadClient.connect(port, PATHS[protocol], rcvbuf=4096 if behaviour == "stop_reading" else None)
    if protocol == "raw":
        await client.send(json.dumps({"type": "open"}))
    while (m := await client.receive(timeout=30)) != b"\x00" and not (isinstance(m, str) and "ready" in m):
        pass
    return client


async def misbehave(client: BadClient, behaviour: str) -> None:
    if behaviour == "reset":
        client.reset()
    elif behaviour == "header_only":
        await client.send_raw(frame_header(1 << 30))
    elif behaviour == "fragments":
        try:
            await client.send_raw(masked_frame(b"x" * 4096, opcode=0x2, fin=False))
            while True:
                await client.send_raw(masked_frame(b"x" * 4096, opcode=0x0, fin=False))
        except (trio.BrokenResourceError, OSError):
            pass


async def one_case(settings: ServerSettings, protocol: str, behaviour: str) -> dict:
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve, settings, EchoEngine(settings.slots, prefill_steps=8))
        state = handle.server
        witness = RawWitness(handle.ws_url)
        nursery.start_soon(witness.run)
        await witness.ready.wait()
        client = await live_client(handle.port, protocol, behaviour)
        await trio.sleep(0.5)
        began = trio.current_time()
        await misbehave(client, behaviour)
        while len(state.sessions) > 1:
            await trio.sleep(0.01)
        gone = trio.current_time() - began
        await trio.sleep(0.5)
        witness.stop.set()
        while state.sessions:
            await trio.sleep(0.01)
        witness.check()
        client.close()
        nursery.cancel_scope.cancel()
    return {
        "protocol": protocol,
        "behaviour": behaviour,
        "gone_after_s": round(gone, 2),
        "witness_frames": len(witness.sent),
        "witness_lost": 0,
    }


async def shutdown_case(settings: ServerSettings) -> dict:
    async with trio.open_nursery() as outer:
        stopped = trio.Event()
        handles: list = []

        async def run() -> None:
            async with trio.open_nursery() as inner:
                handles.append(await inner.start(serve, settings, EchoEngine(settings.slots, prefill_steps=8)))
            stopped.set()

        outer.start_soon(run)
        while not handles:
            await trio.sleep(0.01)
        handle = handles[0]
        clients = [
            await live_client(handle.port, "raw", "stop_reading"),
            await live_client(handle.port, "moshi", "freeze"),
        ]
        await trio.sleep(2.0)  # the non-reading client's buffers fill
        began = trio.current_time()
        await handle.shutdown()
        await stopped.wait()
        took = trio.current_time() - began
        for client in clients:
            client.close()
    return {"shutdown_s": round(took, 2), "clients": "a raw client that stopped reading, a frozen Moshi client"}


async def main(args: argparse.Namespace) -> dict:
    settings = ServerSettings(
        host="127.0.0.1", port=0, slots=2, client_timeout=args.client_timeout, max_message_bytes=args.max_message_bytes
    )
    cases = []
    for protocol in ("raw", "moshi"):
        for behaviour in BEHAVIOURS:
            cases.append(await one_case(settings, protocol, behaviour))
            print(json.dumps(cases[-1]), flush=True)
    shutdown = await shutdown_case(ServerSettings(host="127.0.0.1", port=0, slots=2, client_timeout=60))
    print(json.dumps(shutdown), flush=True)
    return {
        "client_timeout_s": args.client_timeout,
        "cases": cases,
        "shutdown": shutdown,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client-timeout", type=float, default=5.0)
    parser.add_argument("--max-message-bytes", type=int, default=1 << 20)
    parser.add_argument("--name", default="fault-times")
    arguments = parser.parse_args()
    result = trio.run(main, arguments)
    out = REPO / "bench" / "results" / f"{arguments.name}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
