"""TLS: the certificate the server presents, made here when the user has none.

A browser gives a page the microphone only in a secure context: ``https://``,
or ``http://localhost``.  So a server used from another machine needs TLS.
``--ssl DIR`` works like the official server's: it serves ``DIR/cert.pem`` and
``DIR/key.pem``, and when both are missing it creates a self-signed pair there
(with the ``cryptography`` package) valid for every name a user may type:
localhost, the loopback addresses, the host's name and its LAN addresses.  A
browser warns once about a self-signed certificate; the fingerprint in the log
lets the user check that it is this one.  ``--certfile``/``--keyfile`` serve a
real certificate instead.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import logging
import os
import pathlib
import socket
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

logger = logging.getLogger(__name__)

CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
VALID_DAYS = 365


class TLSError(ValueError):
    """The certificate cannot be used or made; the message says which file and what to do."""


@dataclasses.dataclass(frozen=True)
class Certificate:
    """A certificate and key the server can serve, and what the log says about them."""

    cert_path: pathlib.Path
    key_path: pathlib.Path
    fingerprint: str  # SHA-256 of the DER certificate, AA:BB:… as browsers show it
    names: tuple[str, ...]  # DNS names and IP addresses it is valid for
    not_after: datetime.datetime
    created: bool  # made just now
    self_signed: bool  # browsers warn about it once

    def server_context(self) -> ssl.SSLContext:
        """An SSL context for the server side: TLS 1.2+, HTTP/1.1 only (no h2: the transport guard reads HTTP/1.1)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        try:
            context.load_cert_chain(self.cert_path, self.key_path)
        except (ssl.SSLError, OSError) as exc:
            raise TLSError(
                f"cannot use the certificate {self.cert_path} with the key {self.key_path}: {exc}; "
                "check that the key belongs to the certificate and is not encrypted"
            ) from None
        return context


def prepare_certificate(
    *, ssl_dir: pathlib.Path | None, certfile: pathlib.Path | None, keyfile: pathlib.Path | None, host: str
) -> Certificate | None:
    """The certificate the settings ask for (None: plain HTTP), created in ``ssl_dir`` if it has none."""
    if ssl_dir is None and certfile is None:
        return None
    if certfile is not None:
        assert keyfile is not None  # ServerSettings checks the pair
        for path in (certfile, keyfile):
            if not path.is_file():
                raise TLSError(f"{path} does not exist (from --certfile/--keyfile)")
        return _load(certfile, keyfile, created=False)
    assert ssl_dir is not None
    cert, key = ssl_dir / CERT_FILE, ssl_dir / KEY_FILE
    if cert.exists() != key.exists():
        have, missing = (cert, key) if cert.exists() else (key, cert)
        raise TLSError(
            f"--ssl {ssl_dir}: found {have.name} but not {missing.name}; put the other file beside "
            f"it, or remove {have.name} to have a new self-signed pair made"
        )
    created = not cert.exists()
    if created:
        create_self_signed(ssl_dir, local_names(host))
    certificate = _load(cert, key, created=created)
    if not created:
        missing_names = [name for name in local_names(host) if name not in certificate.names]
        if missing_names:
            logger.warning(
                "TLS: the certificate in %s is not valid for %s; browsers will warn there (remove "
                "%s and %s to have a new one made)",
                ssl_dir,
                ", ".join(missing_names),
                CERT_FILE,
                KEY_FILE,
            )
    return certificate


def local_names(host: str) -> list[str]:
    """The names a user may reach this machine by: localhost, loopback, host name, LAN addresses."""
    names = ["localhost", "127.0.0.1", "::1"]
    hostname = socket.gethostname()
    names.append(hostname)
    addresses: list[str] = []
    try:
        # (typeshed allows an int host for AF_INET6 on a Python built without IPv6)
        addresses += [str(info[4][0]) for info in socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)]
    except OSError:
        pass
    for family, probe in ((socket.AF_INET, "10.254.254.254"), (socket.AF_INET6, "fd00::1")):
        try:  # the address of the default route; connecting a UDP socket sends nothing
            with socket.socket(family, socket.SOCK_DGRAM) as udp:
                udp.connect((probe, 9))
                addresses.append(udp.getsockname()[0])
        except OSError:
            pass
    if host not in ("", "0.0.0.0", "::"):
        addresses.append(host)
    names += addresses
    unique: list[str] = []
    for name in names:
        name = name.split("%", 1)[0]  # an IPv6 scope id is no part of a name
        if name and name not in unique:
            unique.append(name)
    return unique


def create_self_signed(directory: pathlib.Path, names: list[str]) -> None:
    """Write ``cert.pem`` and ``key.pem`` (mode 0600) in ``directory``: a self-signed certificate for ``names``."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise TLSError(f"--ssl {directory}: cannot create the folder: {exc.strerror or exc}") from None
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pplex-trio self-signed")])
    now = datetime.datetime.now(datetime.UTC)
    alternative_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alternative_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternative_names.append(x509.DNSName(name))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))  # a client whose clock is a little behind
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        _write(directory / KEY_FILE, key_pem, mode=0o600)
        _write(directory / CERT_FILE, certificate.public_bytes(serialization.Encoding.PEM), mode=0o644)
    except OSError as exc:
        raise TLSError(f"--ssl {directory}: cannot write the certificate: {exc.strerror or exc}") from None
    logger.info(
        "TLS: created a self-signed certificate in %s for %s (valid for %d days)",
        directory,
        ", ".join(names),
        VALID_DAYS,
    )


def _write(path: pathlib.Path, data: bytes, *, mode: int) -> None:
    """Write through a temporary file with ``mode`` from the start, then rename (never a half file)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.chmod(temporary, mode)  # whatever the umask
    os.replace(temporary, path)


def _load(cert_path: pathlib.Path, key_path: pathlib.Path, *, created: bool) -> Certificate:
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise TLSError(f"cannot read the certificate {cert_path}: {exc}; it must be PEM") from None
    fingerprint = certificate.fingerprint(hashes.SHA256()).hex(":").upper()
    try:
        alternative = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = tuple(str(name.value) for name in alternative)
    except x509.ExtensionNotFound:
        names = ()
    certificate_info = Certificate(
        cert_path,
        key_path,
        fingerprint,
        names,
        certificate.not_valid_after_utc,
        created,
        self_signed=certificate.issuer == certificate.subject,
    )
    certificate_info.server_context()  # the key must load and match, now rather than at the first client
    if certificate.not_valid_after_utc < datetime.datetime.now(datetime.UTC):
        logger.warning(
            "TLS: the certificate %s expired on %s; clients will refuse it",
            cert_path,
            certificate.not_valid_after_utc.date(),
        )
    return certificate_info
