"""Telnyx's and Plivo's signatures on the answer route, against the carriers' own SDKs (test-only extras).

Telnyx's SDK only verifies: each request is signed here with Ed25519 as its
documentation says, and the SDK's ``verify_webhook_signature`` must accept it
before the server is asked.  Plivo's SDK signs (``get_signature_v3`` over the
URL it builds) and verifies (``validate_v3_signature``).
"""

from __future__ import annotations

import base64
import time
import urllib.parse

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from pplex_trio.protocol import plivo, telnyx
from pplex_trio.server import ServerSettings

telnyx_verification = pytest.importorskip("telnyx.lib.webhook_verification")
plivo_signature = pytest.importorskip("plivo.utils.signature_v3")

TELNYX_KEY = Ed25519PrivateKey.generate()
TELNYX_PUBLIC = base64.b64encode(TELNYX_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
PLIVO_AUTH = "plivo-auth-MAZDQ1MTA2ZTk4NTY3"
FORM = {"CallSid": "v3:abc", "From": "+14155550100", "To": "+14155550199", "Direction": "inbound"}
FORM_BODY = "&".join(f"{k}={urllib.parse.quote_plus(v)}" for k, v in FORM.items())
FORM_TYPE = {"Content-Type": "application/x-www-form-urlencoded"}


def telnyx_headers(body: str, *, timestamp: float | None = None, key: Ed25519PrivateKey = TELNYX_KEY) -> dict:
    stamp = str(int(time.time() if timestamp is None else timestamp))
    sig = base64.b64encode(key.sign(f"{stamp}|{body}".encode())).decode()
    headers = {"telnyx-signature-ed25519": sig, "telnyx-timestamp": stamp}
    if key is TELNYX_KEY and timestamp is None:  # the SDK agrees that this one is Telnyx's
        telnyx_verification.verify_webhook_signature(body, headers, TELNYX_PUBLIC)
    return headers


def plivo_headers(url: str, nonce: str, form: dict[str, str] | None = None, token: str = PLIVO_AUTH) -> dict:
    base = plivo_signature.construct_post_url(url, dict(form)) if form else plivo_signature.construct_get_url(url, {})
    sig = plivo_signature.get_signature_v3(token.encode(), base.decode(), nonce).decode()
    if token == PLIVO_AUTH:
        assert plivo_signature.validate_v3_signature(
            "POST" if form else "GET", url, nonce, token, sig, dict(form) if form else None
        )
    return {"X-Plivo-Signature-V3": f"someone-else's,{sig}", "X-Plivo-Signature-V3-Nonce": nonce}


def test_telnyx_signatures_the_sdk_accepts_are_ours_too_and_no_others():
    key, body = telnyx.public_key(TELNYX_PUBLIC), FORM_BODY.encode()
    headers = telnyx_headers(FORM_BODY)
    sig, stamp, now = headers["telnyx-signature-ed25519"], headers["telnyx-timestamp"], time.time()
    assert telnyx.signature_matches(sig, stamp, body, key, now)
    assert not telnyx.signature_matches(sig, stamp, body + b"&x=1", key, now)
    assert not telnyx.signature_matches(
        sig,
        stamp,
        body,
        telnyx.public_key(
            base64.b64encode(
                Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            ).decode()
        ),
        now,
    )
    assert not telnyx.signature_matches(sig, stamp, body, key, now + 301)  # a replay, too late
    assert not telnyx.signature_matches(sig, str(int(stamp) + 1), body, key, now)
    assert not telnyx.signature_matches(None, stamp, body, key, now)
    assert not telnyx.signature_matches(sig, None, body, key, now)
    assert not telnyx.signature_matches("not base64!", stamp, body, key, now)
    with pytest.raises(ValueError, match="Keys & Credentials"):
        telnyx.public_key("c2hvcnQ=")


@pytest.mark.parametrize(
    "url, form",
    [
        ("https://voice.example.com/telephony/plivo/answer", None),
        (
            "https://voice.example.com/telephony/plivo/answer?token=t&persona=Hi+there%21&voice=NATM1.pt&a=2&a=1&e=",
            None,
        ),
        ("https://voice.example.com/telephony/plivo/answer", FORM),
        ("https://voice.example.com/telephony/plivo/answer?persona=caf%20au+lait&token=t", FORM),
    ],
)
def test_plivo_signatures_match_the_sdk(url, form):
    pairs = list((form or {}).items())
    headers = plivo_headers(url, "05429567804466091622", form)
    assert plivo.signature_matches(headers["X-Plivo-Signature-V3"], "05429567804466091622", PLIVO_AUTH, url, pairs)
    mine = plivo.signature(PLIVO_AUTH, url, "05429567804466091622", pairs)
    assert plivo_signature.validate_v3_signature(
        "POST" if form else "GET", url, "05429567804466091622", PLIVO_AUTH, mine, dict(form) if form else None
    )
    assert not plivo.signature_matches(headers["X-Plivo-Signature-V3"], "1", PLIVO_AUTH, url, pairs)
    assert not plivo.signature_matches(headers["X-Plivo-Signature-V3"], "05429567804466091622", "other", url, pairs)
    assert not plivo.signature_matches(
        headers["X-Plivo-Signature-V3"],
        "05429567804466091622",
        PLIVO_AUTH,
        url + ("&" if "?" in url else "?") + "persona=x",
        pairs,
    )
    assert not plivo.signature_matches(None, "05429567804466091622", PLIVO_AUTH, url, pairs)


def test_the_secrets_are_checked_at_startup():
    with pytest.raises(ValueError, match="--telnyx-public-key"):
        ServerSettings(telnyx_public_key="not-a-key")
    with pytest.raises(ValueError, match="--plivo-auth-token"):
        ServerSettings(plivo_auth_token=" ")


async def test_with_a_telnyx_public_key_only_signed_requests_are_answered(virtual_server, autojump_clock):
    handle = await virtual_server(telnyx_public_key=TELNYX_PUBLIC)
    path = "/telephony/telnyx/answer?persona=Hi"
    async with handle.http() as http:
        good = await http.post(path, content=FORM_BODY, headers={**FORM_TYPE, **telnyx_headers(FORM_BODY)})
        assert good.status_code == 200 and "<Stream" in good.text
        assert (await http.get(path, headers=telnyx_headers(""))).status_code == 200
        other = Ed25519PrivateKey.generate()
        for headers in (
            {},
            telnyx_headers(FORM_BODY + "&x=1"),
            telnyx_headers(FORM_BODY, key=other),
            telnyx_headers(FORM_BODY, timestamp=time.time() - 600),
            {"telnyx-signature-ed25519": telnyx_headers(FORM_BODY)["telnyx-signature-ed25519"]},
        ):
            refused = await http.post(path, content=FORM_BODY, headers={**FORM_TYPE, **headers})
            assert refused.status_code == 403 and "telnyx-signature-ed25519" in refused.json()["error"]
        # The other carriers are not asked for Telnyx's signature.
        assert (await http.get("/telephony/twilio/answer")).status_code == 200


async def test_with_a_plivo_auth_token_only_signed_requests_are_answered(virtual_server, autojump_clock):
    handle = await virtual_server(plivo_auth_token=PLIVO_AUTH)
    path = "/telephony/plivo/answer?persona=Hi"
    url = f"http://127.0.0.1:{handle.port}{path}"
    async with handle.http() as http:
        good = await http.post(path, data=FORM, headers=plivo_headers(url, "n-1", FORM))
        assert good.status_code == 200 and "<Stream" in good.text
        assert (await http.get(path, headers=plivo_headers(url, "n-2"))).status_code == 200
        # Behind a TLS proxy, the URL Plivo signed is the public one.
        public = "https://voice.example.com" + path
        proxied = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "voice.example.com"}
        assert (await http.get(path, headers={**proxied, **plivo_headers(public, "n-3")})).status_code == 200
        for headers in (
            {},
            plivo_headers(url, "n-4", {**FORM, "To": "+1"}),
            plivo_headers(url, "n-5", FORM, "x"),
            plivo_headers(url + "&voice=NATM1.pt", "n-6", FORM),
            {"X-Plivo-Signature-V3": plivo_headers(url, "n-7", FORM)["X-Plivo-Signature-V3"]},
        ):
            refused = await http.post(path, data=FORM, headers=headers)
            assert refused.status_code == 403 and "X-Plivo-Signature-V3" in refused.json()["error"]
