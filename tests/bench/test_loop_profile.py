"""bench/loop_profile.py: py-spy's collapsed stacks sorted into buckets (no py-spy needed)."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_loop_profile", ROOT / "bench" / "loop_profile.py")
profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile)

RAW = """\
thread (100): MainThread;run (trio/_core/_run.py:2300);get_events (trio/_core/_io_epoll.py:245) 60
thread (100): MainThread;run (trio/_core/_run.py:2300);Session._process_loop (pplex_trio/server/sessions/_session.py:280);MoshiProtocol.decode (pplex_trio/server/sessions/_moshi.py:48);MoshiProtocol.decode.<locals>.<listcomp> (pplex_trio/server/sessions/_moshi.py:49) 10
thread (100): MainThread;run (trio/_core/_run.py:2300);_send_loop (pplex_trio/server/sessions/_session.py:250);send (quart/wrappers/websocket.py:80);app_send (hypercorn/protocol/ws_stream.py:300);send (wsproto/connection.py:90) 20
thread (100): MainThread;run (trio/_core/_run.py:2300);_send_loop (pplex_trio/server/sessions/_session.py:250);send (quart/wrappers/websocket.py:80) 10
thread (100): MainThread;run (trio/_core/_run.py:2300);app_send (hypercorn/protocol/ws_stream.py:300);send_all (trio/_highlevel_socket.py:120) 7
thread (100): MainThread;run (trio/_core/_run.py:2300);_read_data (hypercorn/trio/tcp_server.py:101);GuardedStream.receive_some (pplex_trio/server/transport/_guarded_stream.py:70);receive_some (trio/_highlevel_socket.py:150) 5
thread (100): MainThread;main (pplex_trio/_cli.py:101);run (trio/_core/_run.py:2300);unrolled_run (trio/_core/_run.py:2500) 3
thread (101): Trio thread 0;_execute (pplex_trio/engine/_actor.py:240) 500
bad line
"""


def test_main_thread_samples_go_to_the_innermost_bucket():
    counts, total = profile.summarize(RAW)
    assert total == 115  # the worker thread's 500 samples are not the event loop's
    assert counts == {
        "idle (epoll wait)": 60,
        "input decode (sphn Opus; Realtime base64, G.711)": 10,
        "WebSocket framing (wsproto)": 20,
        "Quart websocket layer": 10,
        "HTTP server (hypercorn, h11)": 7,  # its socket send, inside Trio, is its own
        "transport: socket I/O and the guard": 5,  # under hypercorn, the guarded socket's own
        "Trio scheduler alone": 3,
    }
