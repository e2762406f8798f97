"""deploy/nginx/pplex-trio.conf, run: Debian's nginx in front of two echo replicas on loopback.

The shipped file is used as it is, but for its addresses: the upstream's
``server`` lines point at the two replicas and ``listen 80`` at a free port.
Each replica is the real command (``pplex-trio serve --model echo``) with the
flags docs/DEPLOY.md gives (``--refuse-busy-upgrades``, ``--drain-seconds``).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import trio

from _helpers.process import start_serve
from _helpers.ws import raw_open
from pplex_trio.client import Refused, open_websocket

REPO = pathlib.Path(__file__).resolve().parents[2]
CONF = REPO / "deploy" / "nginx" / "pplex-trio.conf"
DUPLEX = "/v1/audio/duplex"


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        pytest.fail("nginx is not installed: `bash .ci/setup --test` installs Debian's (apt-get install nginx-light)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """``pplex-trio serve --model echo`` in a child process, as one GPU's replica would run."""

    ARGS = ("--model", "echo:prompt=1", "--refuse-busy-upgrades", "--drain-seconds", "60")

    def __init__(self, *args: str):
        self.proc, port, self.lines = start_serve(*self.ARGS, *args)
        self.address = f"127.0.0.1:{port}"
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    async def sessions(self) -> int:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"http://{self.address}/health")).json()["sessions"]

    async def ready(self) -> int:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"http://{self.address}/ready")).status_code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def render(conf: str, listen: int, replicas: list[str]) -> str:
    """The shipped configuration with our addresses; fails if the file no longer has the lines we replace."""
    servers = re.findall(r"^    server 127\.0\.0\.1:\d+ (.*);$", conf, flags=re.M)
    assert len(servers) == 2, "deploy/nginx/pplex-trio.conf should list two example replicas"
    lines = "\n".join(f"    server {address} {servers[0]};" for address in replicas)
    conf = re.sub(r"(^    server 127\.0\.0\.1:\d+ .*;\n)+", lines + "\n", conf, count=1, flags=re.M)
    conf, listens = re.subn(r"^    listen 80;$", f"    listen 127.0.0.1:{listen};", conf, flags=re.M)
    assert listens == 1
    return conf


@contextlib.contextmanager
def nginx_in_front_of(replicas: list[Replica], tmp_path: pathlib.Path) -> Iterator[str]:
    """nginx with the shipped configuration; yields its address."""
    port = free_port()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "pplex-trio.conf").write_text(render(CONF.read_text(), port, [r.address for r in replicas]))
    user = (
        "user root;" if os.geteuid() == 0 else ""
    )  # as root, nginx's workers would be nobody, and our temp dir is ours
    (tmp_path / "nginx.conf").write_text(f"""
{user}
worker_processes 2;
error_log stderr notice;
pid nginx.pid;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path tmp/body; proxy_temp_path tmp/proxy; fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi; scgi_temp_path tmp/scgi;
    include pplex-trio.conf;
}}
""")
    binary = nginx_binary()
    check = subprocess.run([binary, "-t", "-p", str(tmp_path), "-c", "nginx.conf"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen(
        [binary, "-p", str(tmp_path), "-c", "nginx.conf", "-g", "daemon off;"], stderr=subprocess.PIPE, text=True
    )
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.1):
                break
            if proc.poll() is not None:
                raise RuntimeError("nginx did not start:\n" + proc.stderr.read())
            time.sleep(0.05)  # a moment at startup: nothing else runs yet
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGQUIT)  # graceful: finish the open connections' writes
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@contextlib.asynccontextmanager
async def through_nginx(replicas: list[Replica], tmp_path: pathlib.Path) -> AsyncIterator[tuple[str, trio.Nursery]]:
    """nginx's address, and a nursery for conversations that all end before nginx stops."""
    with nginx_in_front_of(replicas, tmp_path) as balancer:
        async with trio.open_nursery() as nursery:
            yield balancer, nursery


@pytest.fixture
def replicas():
    """``replicas(n, *args)``: n replicas, each with ``args``."""
    started: list[Replica] = []

    def start(n: int, *args: str) -> list[Replica]:
        new = [Replica(*args) for _ in range(n)]
        started.extend(new)
        return new

    yield start
    for replica in started:
        replica.stop()


async def converse(url: str, opened: trio.Event, done: trio.Event, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A raw conversation that stays live until ``done``."""
    async with open_websocket(url) as ws:
        await raw_open(ws)
        task_status.started()
        opened.set()
        await done.wait()


async def refusal(url: str) -> Refused:
    with pytest.raises(Refused) as caught:
        async with open_websocket(url) as ws:
            await raw_open(ws)
    return caught.value


async def test_new_conversations_go_to_the_replica_with_a_free_slot(replicas, tmp_path):
    a, b = replicas(2, "--slots", "2", "--queue-size", "0")
    async with through_nginx([a, b], tmp_path) as (balancer, nursery):
        done = trio.Event()
        for _ in range(2):  # fill a's slots behind nginx's back: nginx still counts a as empty
            await nursery.start(converse, f"ws://{a.address}{DUPLEX}", trio.Event(), done)
        assert await a.ready() == 503
        # Through nginx: least_conn sends the first or the second to a (no connections of nginx's
        # there), a answers 503 before the upgrade, and nginx passes it on to b.
        for _ in range(2):
            await nursery.start(converse, f"ws://{balancer}{DUPLEX}", trio.Event(), done)
        assert (await a.sessions(), await b.sessions()) == (2, 2)
        # Every slot taken: nginx has tried both, and the client gets the replicas' 503 and its reason.
        refused = await refusal(f"ws://{balancer}{DUPLEX}")
        assert refused.status == 503 and "taken" in str(refused)
        done.set()


async def test_a_draining_replica_gets_no_new_conversations_and_keeps_its_own(replicas, tmp_path):
    first, second = replicas(2, "--slots", "4")
    async with through_nginx([first, second], tmp_path) as (balancer, nursery):
        done, keep = trio.Event(), trio.Event()
        via_nginx = f"ws://{balancer}{DUPLEX}"
        await nursery.start(converse, via_nginx, trio.Event(), keep)
        draining, other = (first, second) if await first.sessions() == 1 else (second, first)
        await nursery.start(converse, via_nginx, trio.Event(), done)
        assert (await draining.sessions(), await other.sessions()) == (1, 1)  # least_conn: one each
        draining.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(5):
            while await draining.ready() != 503:
                await trio.sleep(0.02)
        # Two more: least_conn prefers the draining replica (fewer connections) for at least one
        # of them; it refuses before the upgrade, and both land on the other.
        for _ in range(2):
            await nursery.start(converse, via_nginx, trio.Event(), done)
        assert (await draining.sessions(), await other.sessions()) == (1, 3)
        assert draining.proc.poll() is None  # still serving the conversation it has
        keep.set()  # that conversation ends: the drain is over, and the replica exits cleanly
        assert await trio.to_thread.run_sync(lambda: draining.proc.wait(timeout=10)) == 0
        done.set()
