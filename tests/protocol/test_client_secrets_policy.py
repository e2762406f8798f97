"""Client secrets on their own, on a clock the test moves: expiry at the edge, one use, the cap, the request's checks,
and what the access policy makes of a secret (no sockets)."""

from __future__ import annotations

import pytest

from pplex_trio.protocol import AccessPolicy, Allowed, ClientSecrets, EventError, Refused, RequestHead, SessionConfig
from pplex_trio.protocol import parse_secret_request as parse

TOKEN = "s3cret-token-0123456789"
CONFIG = SessionConfig(instructions="You are a lighthouse keeper.", voice="NATF1.pt")
VOICES = ("NATF0.pt", "NATF1.pt")


def request(body):
    return parse(body, default_seconds=60, max_prompt_chars=100, voices=lambda: VOICES)


def test_a_secret_looks_like_openais_and_is_random():
    secrets = ClientSecrets()
    values = {secrets.mint(CONFIG, seconds=60, now=0.0).value for _ in range(50)}
    assert len(values) == 50
    for value in values:
        assert value.startswith("ek_") and len(value) >= 3 + 22  # ≥ 128 bits in base64url (22 chars)


def test_one_use():
    secrets = ClientSecrets()
    minted = secrets.mint(CONFIG, seconds=60, now=100.0)
    assert minted.expires == 160.0
    assert secrets.spend(minted.value, now=101.0) == CONFIG
    second = secrets.spend(minted.value, now=102.0)
    assert isinstance(second, str) and "used already" in second


def test_expiry_exactly_at_the_edge():
    secrets = ClientSecrets()
    early, late = (secrets.mint(CONFIG, seconds=10, now=5.0) for _ in range(2))
    assert secrets.spend(early.value, now=14.999) == CONFIG  # still good just before
    refused = secrets.spend(late.value, now=15.0)  # and no longer at the instant it expires
    assert isinstance(refused, str) and "expired" in refused
    assert "unknown" in secrets.spend(late.value, now=15.0)  # (an expired secret is forgotten)


def test_unknown_secrets_are_refused():
    secrets = ClientSecrets()
    secrets.mint(CONFIG, seconds=60, now=0.0)
    assert "unknown" in secrets.spend("ek_guess", now=1.0)


def test_the_cap_bounds_what_a_flood_of_mints_keeps():
    secrets = ClientSecrets(cap=3)
    first = secrets.mint(CONFIG, seconds=10, now=0.0)
    others = [secrets.mint(CONFIG, seconds=100, now=1.0) for _ in range(2)]
    assert all(others) and len(secrets) == 3
    assert secrets.mint(CONFIG, seconds=10, now=2.0) is None  # full
    secrets.spend(first.value, now=3.0)
    assert secrets.mint(CONFIG, seconds=10, now=9.0) is None  # a spent secret counts until it expires
    assert secrets.mint(CONFIG, seconds=10, now=10.0) is not None  # the first expired: room for one
    assert secrets.mint(CONFIG, seconds=10, now=10.0) is None and len(secrets) == 3
    assert all(secrets.spend(minted.value, now=11.0) == CONFIG for minted in others)


# -- the request ------------------------------------------------------------------------


def test_the_request_as_the_sdk_sends_it():
    body = {
        "expires_after": {"anchor": "created_at", "seconds": 600},
        "session": {"type": "realtime", "instructions": "Be brief.", "audio": {"output": {"voice": "NATF0.pt"}}},
    }
    assert request(body) == (600, SessionConfig(instructions="Be brief.", voice="NATF0.pt"))
    assert request({}) == (60, SessionConfig())  # the setting's default, the server's defaults
    assert request(None) == (60, SessionConfig())
    assert request({"expires_after": {"seconds": 10}})[0] == 10
    assert request({"expires_after": {"seconds": 7200}})[0] == 7200


@pytest.mark.parametrize(
    "body, param",
    [
        ({"expires_after": {"seconds": 9}}, "expires_after.seconds"),
        ({"expires_after": {"seconds": 7201}}, "expires_after.seconds"),
        ({"expires_after": {"seconds": 30.5}}, "expires_after.seconds"),
        ({"expires_after": {"seconds": True}}, "expires_after.seconds"),
        ({"expires_after": {"anchor": "now", "seconds": 30}}, "expires_after.anchor"),
        ({"expires_after": 30}, "expires_after"),
        ({"session": "realtime"}, "session"),
        ({"session": {"type": "transcription"}}, "session.type"),
        ({"session": {"type": "realtime", "instructions": "x" * 101}}, "session.instructions"),
        ({"session": {"type": "realtime", "audio": {"output": {"voice": "nobody.pt"}}}}, "session.audio.output.voice"),
        ({"session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/flac"}}}}}, None),
        ([], None),
    ],
)
def test_bad_requests_say_what_is_wrong(body, param):
    with pytest.raises(EventError) as error:
        request(body)
    if param is not None:
        assert error.value.param == param


# -- the access policy ------------------------------------------------------------------


def head(path="/v1/realtime", *, websocket=True, query=b"", method="GET", **headers: str) -> RequestHead:
    return RequestHead(
        websocket=websocket,
        path=path,
        query=query,
        method=method,
        headers=[(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()],
    )


def policy(token: str | None = TOKEN) -> tuple[AccessPolicy, ClientSecrets]:
    secrets = ClientSecrets()
    access = AccessPolicy(
        token=token,
        client_secrets=secrets,
        secret_paths=frozenset({"/v1/realtime"}),
        secret_posts=frozenset({"/v1/realtime/calls"}),
    )
    return access, secrets


@pytest.mark.parametrize(
    "give, via",
    [
        (lambda v: head(authorization=f"Bearer {v}"), "header"),
        (lambda v: head(query=f"model=x&token={v}".encode()), "query"),
        (lambda v: head(sec_websocket_protocol=f"realtime, openai-insecure-api-key.{v}"), "subprotocol"),
    ],
)
@pytest.mark.parametrize("token", [TOKEN, None])
def test_a_secret_opens_one_realtime_call_with_its_settings(give, via, token):
    access, secrets = policy(token)
    value = secrets.mint(CONFIG, seconds=60, now=0.0).value
    assert access.check(give(value), now=1.0) == Allowed(via, grant=CONFIG)
    again = access.check(give(value), now=2.0)
    assert isinstance(again, Refused) and again.status == 401 and "used already" in again.message
    assert value not in again.message


def test_a_secret_opens_nothing_else():
    access, secrets = policy()
    value = secrets.mint(CONFIG, seconds=60, now=0.0).value
    for request_head in (
        head("/v1/audio/duplex", authorization=f"Bearer {value}"),
        head("/v1/live/sessions", authorization=f"Bearer {value}"),
        head("/v1/realtime/client_secrets", websocket=False, authorization=f"Bearer {value}"),
        head("/v1/realtime", websocket=False, authorization=f"Bearer {value}"),
        head("/v1/realtime", websocket=False, method="POST", authorization=f"Bearer {value}"),
        head("/v1/realtime/calls", websocket=False, authorization=f"Bearer {value}"),  # (a GET: no call)
        head("/v1/realtime/calls", authorization=f"Bearer {value}"),  # (a WebSocket there: no call)
        head("/v1/live/sessions", websocket=False, method="POST", authorization=f"Bearer {value}"),
        head("/api/info", websocket=False, query=f"token={value}".encode()),
    ):
        refused = access.check(request_head, now=1.0)
        assert isinstance(refused, Refused) and refused.status == 401, request_head.path
        assert "opens one Realtime call" in refused.message
    assert access.check(head(authorization=f"Bearer {value}"), now=1.0) == Allowed("header", grant=CONFIG)


def test_a_secret_opens_one_webrtc_call():
    """The WebRTC offer (a POST to /v1/realtime/calls) is a Realtime call a secret opens, once."""
    access, secrets = policy()
    value = secrets.mint(CONFIG, seconds=60, now=0.0).value
    offer = head("/v1/realtime/calls", websocket=False, method="POST", authorization=f"Bearer {value}")
    assert access.check(offer, now=1.0) == Allowed("header", grant=CONFIG)
    again = access.check(offer, now=2.0)
    assert isinstance(again, Refused) and again.status == 401 and "used already" in again.message
    assert isinstance(access.check(head(authorization=f"Bearer {value}"), now=2.0), Refused)  # (nor a WebSocket)
    late = secrets.mint(CONFIG, seconds=10, now=0.0).value
    offer = head("/v1/realtime/calls", websocket=False, method="POST", authorization=f"Bearer {late}")
    expired = access.check(offer, now=10.0)
    assert isinstance(expired, Refused) and expired.status == 401 and "expired" in expired.message


def test_an_expired_secret_and_the_token_beside_it():
    access, secrets = policy()
    value = secrets.mint(CONFIG, seconds=10, now=0.0).value
    refused = access.check(head(authorization=f"Bearer {value}"), now=10.0)
    assert isinstance(refused, Refused) and "expired" in refused.message
    assert access.check(head(authorization=f"Bearer {TOKEN}"), now=10.0) == Allowed("header")  # the token: no grant
    # A server token that happens to look like a secret is still the token.
    odd = AccessPolicy(token="ek_operator", client_secrets=secrets, secret_paths=frozenset({"/v1/realtime"}))
    assert odd.check(head("/api/info", websocket=False, authorization="Bearer ek_operator"), now=0.0) == Allowed(
        "header"
    )
