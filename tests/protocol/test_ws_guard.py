"""The inbound guard, sans-IO: request heads, the upgrade, frame headers, in any split of the bytes."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _helpers.bad_client import frame_header, masked_frame
from pplex_trio.protocol._ws_guard import InboundGuard

UPGRADE = (
    b"GET /api/chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    b"Sec-WebSocket-Key: abc\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def upgraded(limit=1000) -> InboundGuard:
    guard = InboundGuard(limit)
    passed, refusal = guard.inbound(UPGRADE)
    assert refusal is None and b"permessage-deflate" not in passed and b"Sec-WebSocket-Key: abc" in passed
    guard.outbound(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert guard.websocket
    return guard


def feed(guard, data, step):
    out, refusal = bytearray(), None
    for i in range(0, len(data), step):
        passed, refusal = guard.inbound(data[i : i + step])
        out += passed
        if refusal:
            break
    return bytes(out), refusal


@given(st.integers(1, 64), st.lists(st.integers(0, 300), min_size=1, max_size=8))
def test_frames_within_the_limit_pass_unchanged_in_any_split(step, sizes):
    frames = b"".join(masked_frame(os.urandom(n), opcode=0x2, fin=True) for n in sizes)
    frames += masked_frame(b"", opcode=0xA, fin=True)  # a pong between messages
    out, refusal = feed(upgraded(), frames, step)
    assert refusal is None and out == frames


def test_a_header_claiming_more_than_the_limit_is_refused_before_any_payload():
    guard = upgraded(limit=1000)
    passed, refusal = guard.inbound(frame_header(1001))
    assert refusal is not None and refusal.close_code == 1009 and passed == b""


def test_fragments_count_towards_one_message_and_control_frames_do_not():
    guard = upgraded(limit=1000)
    stream = (
        masked_frame(b"a" * 400, opcode=0x2, fin=False)
        + masked_frame(b"", opcode=0x9, fin=True)
        + masked_frame(b"b" * 400, opcode=0x0, fin=False)
    )
    assert guard.inbound(stream)[1] is None
    assert guard.inbound(masked_frame(b"c" * 201, opcode=0x0, fin=True))[1].close_code == 1009
    fresh = upgraded(limit=1000)  # a new message starts counting again
    for _ in range(5):
        assert fresh.inbound(masked_frame(b"d" * 900, opcode=0x1, fin=True))[1] is None


@pytest.mark.parametrize(
    "head, status",
    [
        (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"y" * 20_000, 431),
        (b"POST / HTTP/1.1\r\nContent-Length: lots\r\n\r\n", 400),
    ],
)
def test_bad_request_heads_are_refused(head, status):
    assert InboundGuard(1000).inbound(head)[1].http_status == status


def test_bodies_are_skipped_and_keep_alive_requests_followed_to_a_later_upgrade():
    guard = InboundGuard(1000)
    body = b"x" * 5000  # bigger than a message: a body is not a frame
    first = b"POST /a HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + body
    passed, refusal = guard.inbound(first + UPGRADE[:40])
    assert refusal is None and passed == first
    guard.inbound(UPGRADE[40:])
    guard.outbound(b"HTTP/1.1 101 ")
    assert guard.inbound(frame_header(5000))[1].close_code == 1009


def test_a_refused_upgrade_goes_on_as_http_and_early_data_is_refused():
    guard = InboundGuard(1000)
    guard.inbound(UPGRADE)
    assert guard.inbound(b"\x82\x80abcd")[1].http_status == 400  # frames before the 101: RFC 6455 4.1
    other = InboundGuard(1000)
    other.inbound(UPGRADE)
    other.outbound(b"HTTP/1.1 404 Not Found\r\n")
    passed, refusal = other.inbound(b"GET /health HTTP/1.1\r\n\r\n")
    assert refusal is None and passed.startswith(b"GET /health") and not other.websocket


def test_a_chunked_body_is_refused_so_nothing_can_slip_past_the_guard():
    head = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert InboundGuard(1000).inbound(head + b"5\r\nhello\r\n0\r\n\r\n")[1].http_status == 411
