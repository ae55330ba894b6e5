"""The HTTPS endpoints' serving certificates: files that are re-read when they change, or a self-signed one.

kubebuilder's and controller-runtime's layout: a directory (`--metrics-cert-path`, `--webhook-cert-dir`) holding a
certificate and its key, by default `tls.crt` and `tls.key` (other names: `--metrics-cert-name`/`--metrics-cert-key`,
`--webhook-cert-name`/`--webhook-key-name`), as a cert-manager Secret mounted there provides them.
`ServingCertificate.load` builds the server's `ssl.SSLContext`: from the files when both exist, else from a
self-signed certificate generated in memory (the development certificate). `refresh()` compares the files' stat
fingerprints (cheap) and loads them into the same context when they changed, so cert-manager's rotations take
effect for new connections without a restart. The context negotiates as its `TlsOptions` say (the `--tls-*`
flags, `ipam_provider/runtime/flagforms.py`).
"""

from __future__ import annotations

import datetime
import socket
import ssl
import tempfile
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

SELF_SIGNED_DAYS = 365
CERT_NAME = "tls.crt"  # controller-runtime's default file names in a certificate directory
KEY_NAME = "tls.key"
Fingerprint = tuple[tuple[int, int, int], tuple[int, int, int]] | None


@dataclass(frozen=True)
class TlsOptions:
    """What the serving context negotiates: `minimum` version, and `ciphers`, the OpenSSL cipher list for TLS 1.2
    (None: Python's default list). `insecure` names the chosen suites Go calls insecure, for a warning."""

    minimum: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    ciphers: str | None = None
    insecure: tuple[str, ...] = ()

    def apply(self, context: ssl.SSLContext) -> None:
        """Set them on a server context (before it serves; a certificate reload keeps them)."""
        context.minimum_version = self.minimum
        if self.ciphers is not None:
            context.set_ciphers(self.ciphers)
        if self.insecure:
            log.warning("an HTTPS endpoint offers insecure cipher suites", suites=list(self.insecure))


class CertificateError(Exception):
    """The certificate files exist but cannot serve: unreadable, not PEM, or a key that does not match."""


@dataclass(frozen=True)
class CertificateFiles:
    """Where the serving certificate is: `directory` (None: none given) with `cert_name` and `key_name` in it."""

    directory: str | None
    cert_name: str = CERT_NAME
    key_name: str = KEY_NAME

    @property
    def cert(self) -> Path | None:
        return Path(self.directory, self.cert_name) if self.directory else None

    @property
    def key(self) -> Path | None:
        return Path(self.directory, self.key_name) if self.directory else None


class ServingCertificate:
    """An `ssl.SSLContext` for a TLS server, kept in step with its certificate files."""

    def __init__(self, files: CertificateFiles, context: ssl.SSLContext, fingerprint: Fingerprint) -> None:
        self.files = files
        self.context = context
        self._fingerprint = fingerprint
        # What is being served, for the log: the certificate file, or "self-signed".
        self.source = str(files.cert) if fingerprint is not None else "self-signed"

    @classmethod
    def load(cls, files: CertificateFiles, tls: TlsOptions | None = None) -> ServingCertificate:
        """The context, with `tls` (default: TLS 1.2 or later, Python's cipher list), from the files if both exist,
        else self-signed. Raises CertificateError for files that exist but cannot be used (including only one of
        the two). Reloads load into the same context, so the options hold for every certificate served."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        (tls or TlsOptions()).apply(context)
        fingerprint = _fingerprint(files)
        if fingerprint is None:
            _load_pem(context, *self_signed_pem(), "the self-signed certificate")
        else:
            _load_pem(context, *_read_files(files))
        return cls(files, context, fingerprint)

    def refresh(self) -> bool:
        """Load the files again if they changed (or appeared) since the last look; True if new ones were loaded.
        Files that cannot be used are logged once and the current certificate is kept; so is it when the files
        disappear. Other errors (OSError) propagate, and the same files are tried again at the next call."""
        fingerprint = _UNUSABLE  # when `_fingerprint` raises
        try:
            fingerprint = _fingerprint(self.files)
            if fingerprint == self._fingerprint or fingerprint is None:
                self._fingerprint = fingerprint
                return False
            _load_pem(self.context, *_read_files(self.files))
        except CertificateError as error:
            if fingerprint != self._fingerprint:  # these files are not tried again until they change
                self._fingerprint = fingerprint
                log.error("keeping the current serving certificate", error=str(error))
            return False
        self._fingerprint = fingerprint  # any other error (a full temporary directory) is retried at the next look
        self.source = str(self.files.cert)
        log.info("reloaded the serving certificate", cert=self.source)
        return True


_UNUSABLE: Fingerprint = ((-1, -1, -1), (-1, -1, -1))


def _fingerprint(files: CertificateFiles) -> Fingerprint:
    """(inode, size, mtime) of both files (stat follows the symlinks of a mounted Secret), or None when neither
    exists. Raises CertificateError when only one does."""
    if files.cert is None or files.key is None:
        return None
    stats: list[tuple[int, int, int] | None] = []
    for path in (files.cert, files.key):
        try:
            stat = path.stat()
            stats.append((stat.st_ino, stat.st_size, stat.st_mtime_ns))
        except FileNotFoundError:
            stats.append(None)
        except OSError as error:
            raise CertificateError(f"cannot read {path}: {error.strerror}") from None
    cert, key = stats
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = files.cert if cert is None else files.key
        raise CertificateError(f"{missing} does not exist, but its pair does")
    return cert, key


def _read_files(files: CertificateFiles) -> tuple[bytes, bytes, str]:
    """Both files' contents, read once (so that a rotation half-way cannot mix two pairs), and a description."""
    assert files.cert is not None and files.key is not None
    try:
        return files.cert.read_bytes(), files.key.read_bytes(), f"{files.cert} with {files.key}"
    except OSError as error:
        raise CertificateError(f"cannot read {error.filename}: {error.strerror}") from None


def _load_pem(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes, what: str) -> None:
    """Load a PEM certificate chain and key into `context`, after proving on a scratch context that they work, so
    that a bad pair never replaces a good one. OpenSSL reads them from files only: they go through a private
    temporary directory, removed at once."""
    with tempfile.TemporaryDirectory(prefix="ipam-metrics-cert-") as directory:
        cert, key = Path(directory, "tls.crt"), Path(directory, "tls.key")
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(str(cert), str(key))
        except ssl.SSLError as error:
            raise CertificateError(f"cannot use {what}: {error.reason or error}") from None
        context.load_cert_chain(str(cert), str(key))


def self_signed_pem(hostname: str | None = None) -> tuple[bytes, bytes]:
    """A self-signed serving certificate (PEM) and its EC P-256 key (PEM, unencrypted) for `hostname` (default:
    this host's name), localhost, 127.0.0.1 and ::1.

    `cryptography` is imported here, not at module level: it costs ~8 MiB of memory, needed only by a controller
    that makes its own certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    host = hostname or socket.gethostname() or "localhost"
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys([host, "localhost"])]
    names += [x509.IPAddress(IPv4Address("127.0.0.1")), x509.IPAddress(IPv6Address("::1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
