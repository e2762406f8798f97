"""TLS: the self-signed pair ``--ssl DIR`` makes, an existing pair, ``--certfile``; HTTPS and WSS end to end.

End to end, one case over real sockets (a real certificate, our command-line
client's stream over the kernel's TCP, as users run it); the others on the
virtual network and clock (the same TLS code, over in-memory connections).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import socket
import ssl
import stat

import httpx
import numpy as np
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from _helpers.certs import issue
from _helpers.ws import moshi_handshake
from pplex_trio.client import client_ssl_context, open_websocket, stream_moshi
from pplex_trio.server import ServerSettings
from pplex_trio.server.transport._tls import TLSError, prepare_certificate


def names_in(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName)), {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def test_ssl_dir_makes_a_self_signed_pair_for_the_local_names(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    folder = tmp_path / "not-yet" / "tls"
    certificate = prepare_certificate(ssl_dir=folder, certfile=None, keyfile=None, host="0.0.0.0")
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    assert certificate is not None and certificate.created and certificate.self_signed
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == ["cert.pem", "key.pem"]  # no temporary files left
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    dns, ips = names_in(cert)
    assert {"localhost", socket.gethostname()} <= dns
    assert {"127.0.0.1", "::1"} <= ips
    assert cert.issuer == cert.subject
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # the key matches
    lifetime = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=360) < lifetime <= datetime.timedelta(days=366)
    der = cert.public_bytes(serialization.Encoding.DER)
    assert certificate.fingerprint == ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())
    assert any("self-signed" in r.getMessage() and str(folder) in r.getMessage() for r in caplog.records)


def test_a_specific_host_address_is_named_too(tmp_path):
    prepare_certificate(ssl_dir=tmp_path, certfile=None, keyfile=None, host="192.0.2.77")
    _, ips = names_in(x509.load_pem_x509_certificate((tmp_path / "cert.pem").read_bytes()))
    assert "192.0.2.77" in ips
    for ip in ips:
        ipaddress.ip_address(ip)  # every IP name is an IP entry, not a DNS one


def test_an_existing_pair_in_the_ssl_dir_is_served_as_it_is(tmp_path):
    issued = issue(tmp_path / "made")
    folder = tmp_path / "tls"
    folder.mkdir()
    (folder / "cert.pem").write_bytes(issued.cert.read_bytes())
    (folder / "key.pem").write_bytes(issued.key.read_bytes())
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    certificate = prepare_certificate(ssl_dir=folder, certfile=None, keyfile=None, host="127.0.0.1")
    assert certificate is not None and not certificate.created and not certificate.self_signed
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    leaf = x509.load_pem_x509_certificate(issued.cert.read_bytes())
    expected = hashlib.sha256(leaf.public_bytes(serialization.Encoding.DER)).hexdigest().upper()
    assert certificate.fingerprint.replace(":", "") == expected
    again = prepare_certificate(ssl_dir=folder, certfile=None, keyfile=None, host="127.0.0.1")
    assert again is not None and again.fingerprint == certificate.fingerprint


@pytest.mark.parametrize("present", ["cert.pem", "key.pem"])
def test_half_a_pair_is_an_error_and_nothing_is_overwritten(tmp_path, present):
    (tmp_path / present).write_text("mine")
    with pytest.raises(TLSError, match=f"found {present} but not"):
        prepare_certificate(ssl_dir=tmp_path, certfile=None, keyfile=None, host="127.0.0.1")
    assert (tmp_path / present).read_text() == "mine" and len(list(tmp_path.iterdir())) == 1


def test_bad_files_are_errors_that_name_them(tmp_path):
    issued = issue(tmp_path / "a")
    other = issue(tmp_path / "b")
    with pytest.raises(TLSError, match="does not exist"):
        prepare_certificate(ssl_dir=None, certfile=tmp_path / "none.pem", keyfile=issued.key, host="h")
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(TLSError, match="junk.pem.*PEM"):
        prepare_certificate(ssl_dir=None, certfile=tmp_path / "junk.pem", keyfile=issued.key, host="h")
    with pytest.raises(TLSError, match="key belongs to the certificate"):
        prepare_certificate(ssl_dir=None, certfile=issued.cert, keyfile=other.key, host="h")


def test_settings_refuse_half_or_double_tls(tmp_path):
    with pytest.raises(ValueError, match="--certfile and --keyfile go together"):
        ServerSettings(certfile=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="either --ssl"):
        ServerSettings(certfile=tmp_path / "c.pem", keyfile=tmp_path / "k.pem", ssl_dir=tmp_path)


# -- end to end --------------------------------------------------------------------------


def tone(seconds: float = 1.2) -> np.ndarray:
    t = np.arange(int(24_000 * seconds)) / 24_000
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


async def test_https_and_wss_with_a_real_certificate(start_server, tmp_path):  # (real sockets)
    issued = issue(tmp_path / "pki", names=("127.0.0.1",))
    handle = await start_server(certfile=issued.cert, keyfile=issued.key)
    assert handle.http_url.startswith("https://") and handle.ws_url.startswith("wss://")
    async with httpx.AsyncClient(verify=issued.client_context()) as http:
        health = await http.get(handle.http_url + "/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
    result = await stream_moshi(
        handle.ws_url + "/api/chat", tone(), tail_seconds=0.5, ssl_context=client_ssl_context(cafile=issued.ca)
    )
    assert np.abs(result.pcm).max() > 0.05  # the echo came back through TLS
    with pytest.raises(ssl.SSLCertVerificationError):  # the system's authorities do not know the test CA
        async with open_websocket(handle.ws_url + "/api/chat"):
            pass


async def test_wss_with_the_self_signed_pair_and_the_client_options(virtual_server, autojump_clock, tmp_path):
    handle = await virtual_server(ssl_dir=tmp_path / "tls")
    url = handle.ws_url + "/api/chat"
    assert url.startswith("wss://")
    for context in (client_ssl_context(cafile=tmp_path / "tls" / "cert.pem"), client_ssl_context(insecure=True)):
        async with handle.open_websocket(url, ssl_context=context) as ws:
            await moshi_handshake(ws)
    with pytest.raises(ssl.SSLCertVerificationError):  # the system's authorities do not know a self-signed pair
        async with handle.open_websocket(url):
            pass


async def test_plain_http_on_the_tls_port_is_redirected_to_https(virtual_server, autojump_clock, tmp_path):
    handle = await virtual_server(ssl_dir=tmp_path / "tls")
    stream = await handle.connect()
    await stream.send_all(f"GET /api/info?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{handle.port}\r\n\r\n".encode())
    answer = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some(4096):
            answer += chunk
    await stream.aclose()
    head = answer.decode().split("\r\n")
    assert head[0] == "HTTP/1.1 301 Moved Permanently"
    assert f"location: https://127.0.0.1:{handle.port}/api/info?x=1" in head
    async with handle.http(ssl_context=client_ssl_context(insecure=True)) as http:  # and it goes on serving TLS
        assert (await http.get("/health")).status_code == 200
