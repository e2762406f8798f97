"""The access policy on its own: tokens, origins, connections per address (no sockets)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from pplex_trio.protocol import AccessPolicy, Allowed, Refused, RequestHead, parse_origins
from pplex_trio.protocol._access import COOKIE_NAME, normalize_origin, query_without_token

TOKEN = "s3cret-token-0123456789"


def head(path="/api/chat", *, websocket=True, query=b"", client="10.0.0.7", **headers: str) -> RequestHead:
    return RequestHead(
        websocket=websocket,
        path=path,
        query=query,
        client=client,
        headers=[(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()],
    )


def expected_cookie(token: str) -> str:
    # Written out here, apart from the code: HMAC-SHA256 keyed by the token over a fixed label.
    return hmac.new(token.encode(), b"pplex-trio browser cookie", hashlib.sha256).hexdigest()


# -- the token ----------------------------------------------------------------------


@pytest.mark.parametrize("websocket", [False, True])
def test_without_a_token_set_everything_is_allowed(websocket):
    assert AccessPolicy().check(head(websocket=websocket), now=0.0) == Allowed(None)


@pytest.mark.parametrize(
    "request_head, via",
    [
        (head(authorization=f"Bearer {TOKEN}"), "header"),
        (head(authorization=f"bearer   {TOKEN} "), "header"),
        (head(query=f"text_prompt=hi&token={TOKEN}".encode()), "query"),
        (head(cookie=f"other=1; {COOKIE_NAME}={expected_cookie(TOKEN)}"), "cookie"),
        (head(cookie=f'{COOKIE_NAME}="{expected_cookie(TOKEN)}"'), "cookie"),
    ],
)
def test_the_three_ways_in(request_head, via):
    assert AccessPolicy(token=TOKEN).check(request_head, now=0.0) == Allowed(via)


@pytest.mark.parametrize(
    "request_head",
    [
        head(),
        head(authorization="Bearer wrong"),
        head(authorization=f"Basic {TOKEN}"),
        head(authorization=f"Bearer {TOKEN[:-1]}"),
        head(authorization=f"Bearer {TOKEN}x"),
        head(authorization="Bearer"),
        head(query=b"token="),
        head(query=f"tok={TOKEN}".encode()),
        head(query=f"token={TOKEN.upper()}".encode()),
        head(cookie=f"{COOKIE_NAME}={TOKEN}"),  # the cookie carries a derived value, not the token
        head(cookie=f"{COOKIE_NAME}={expected_cookie('another-token-xxxxxxxx')}"),
        head(cookie=f"x{COOKIE_NAME}={expected_cookie(TOKEN)}"),
        head(query="token=\udcff".encode("utf-8", "surrogateescape")),
    ],
)
def test_a_wrong_or_missing_token_is_401_and_the_message_never_holds_the_token(request_head):
    verdict = AccessPolicy(token=TOKEN).check(request_head, now=0.0)
    assert isinstance(verdict, Refused) and verdict.status == 401 and verdict.reason == "unauthorized"
    assert TOKEN not in verdict.message and "token" in verdict.message


def test_open_paths_need_no_token():
    policy = AccessPolicy(token=TOKEN, open_paths=frozenset({"/health"}))
    assert policy.check(head("/health", websocket=False), now=0.0) == Allowed(None)
    assert isinstance(policy.check(head("/health/", websocket=False), now=0.0), Refused)
    assert isinstance(policy.check(head("/metrics", websocket=False), now=0.0), Refused)


def test_the_cookie_is_http_only_strict_and_secure_under_tls():
    plain = AccessPolicy(token=TOKEN).set_cookie_header()
    assert plain == f"{COOKIE_NAME}={expected_cookie(TOKEN)}; Path=/; HttpOnly; SameSite=Strict"
    assert AccessPolicy(token=TOKEN, secure=True).set_cookie_header() == plain + "; Secure"


def test_query_without_token_keeps_the_rest():
    assert query_without_token(b"official&token=abc&voice_prompt=NATF2.pt&token=x") == "official=&voice_prompt=NATF2.pt"
    assert query_without_token(b"token=abc") == ""


# -- origins --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin, host",
    [
        ("http://127.0.0.1:8998", "127.0.0.1:8998"),
        ("https://Box.Local:8998", "box.local:8998"),
        ("https://example.com", "example.com"),
        ("https://example.com", "example.com:443"),
        ("http://example.com:80", "example.com"),
        ("http://[::1]:8998", "[::1]:8998"),
    ],
)
def test_own_origin_is_let_in(origin, host):
    assert AccessPolicy().check(head(origin=origin, host=host), now=0.0) == Allowed(None)


@pytest.mark.parametrize(
    "origin, host",
    [
        ("https://evil.example", "127.0.0.1:8998"),
        ("http://127.0.0.1:8999", "127.0.0.1:8998"),  # another port is another origin
        ("https://example.com", "example.com:8443"),
        ("null", "127.0.0.1:8998"),
        ("not an origin", "127.0.0.1:8998"),
        ("http://127.0.0.1:8998", ""),
    ],
)
def test_a_foreign_origin_is_403(origin, host):
    verdict = AccessPolicy().check(head(origin=origin, host=host), now=0.0)
    assert isinstance(verdict, Refused) and verdict.status == 403 and "--allowed-origins" in verdict.message


def test_no_origin_is_let_in_and_plain_http_is_not_origin_checked():
    assert AccessPolicy().check(head(host="127.0.0.1:8998"), now=0.0) == Allowed(None)
    assert AccessPolicy().check(head(websocket=False, origin="https://evil.example"), now=0.0) == Allowed(None)


def test_allowed_origins_are_honoured():
    policy = AccessPolicy(allowed_origins=parse_origins("https://app.example.com, http://localhost:3000"))
    assert policy.check(head(origin="https://APP.example.com:443", host="srv:8998"), now=0.0) == Allowed(None)
    assert policy.check(head(origin="http://localhost:3000", host="srv:8998"), now=0.0) == Allowed(None)
    assert isinstance(policy.check(head(origin="http://localhost:3001", host="srv:8998"), now=0.0), Refused)
    anyone = AccessPolicy(allowed_origins=parse_origins("*"))
    assert anyone.check(head(origin="https://evil.example", host="srv:8998"), now=0.0) == Allowed(None)


def test_the_origin_is_checked_before_the_token():
    verdict = AccessPolicy(token=TOKEN).check(
        head(origin="https://evil.example", host="h", authorization=f"Bearer {TOKEN}"), now=0.0
    )
    assert isinstance(verdict, Refused) and verdict.status == 403


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "https://example.com/path",
        "ftp://example.com",
        "https://",
        "https://example.com:99999",
        "https://user@example.com",
    ],
)
def test_parse_origins_refuses_what_is_not_an_origin(text):
    with pytest.raises(ValueError, match="--allowed-origins"):
        parse_origins(text)


def test_normalize_origin():
    assert normalize_origin("HTTPS://Example.COM:443") == "https://example.com"
    assert normalize_origin("http://example.com:8080/") == "http://example.com:8080"
    assert parse_origins(" , ") == frozenset()


# -- connections per address --------------------------------------------------------


def test_connections_per_address():
    policy = AccessPolicy(max_connections_per_address=2)
    assert policy.open("10.0.0.1") is None and policy.open("10.0.0.1") is None
    refused = policy.open("10.0.0.1")
    assert isinstance(refused, Refused) and refused.status == 429 and "2" in refused.message
    assert policy.open("10.0.0.2") is None  # another address is not affected
    policy.close("10.0.0.1")
    assert policy.connections("10.0.0.1") == 1
    assert policy.open("10.0.0.1") is None  # room again
    for _ in range(5):
        policy.close("10.0.0.1")  # more closes than opens never go below zero
    assert policy.connections("10.0.0.1") == 0


def test_no_limit_counts_nothing():
    policy = AccessPolicy()
    for _ in range(100):
        assert policy.open("10.0.0.1") is None
    assert policy.connections("10.0.0.1") == 0
