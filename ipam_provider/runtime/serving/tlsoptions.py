"""The HTTPS endpoints' TLS options (metrics, admission webhook): `--tls-min-version`, `--tls-cipher-suites`.

In Go's forms: a Cluster API manager reads them with Kubernetes component-base: versions as `VersionTLS12`, cipher
suites as the IANA names Go's crypto/tls gives them (`TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256`). Here each suite
name maps to its OpenSSL name for `SSLContext.set_ciphers`. The TLS 1.3 suites are accepted, but, as in Go, they
cannot be chosen: all three are always on when TLS 1.3 is negotiated. TLS 1.0 and 1.1 are known names that are refused:
OpenSSL 3 negotiates them only at security level 0, and Python deprecates them.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import structlog

from ipam_provider.runtime.flagforms import FlagError

log = structlog.get_logger(__name__)

DEFAULT_MIN_VERSION = "VersionTLS12"
MIN_VERSIONS = {"VersionTLS12": ssl.TLSVersion.TLSv1_2, "VersionTLS13": ssl.TLSVersion.TLSv1_3}
REFUSED_VERSIONS = ("VersionTLS10", "VersionTLS11")

# Go's crypto/tls.CipherSuites(): the suites without known weaknesses; TLS 1.3 ones map to None.
SECURE_SUITES: dict[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    # The older names component-base still accepts.
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}

LEGACY_NAMES = frozenset({"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"})

# Go's crypto/tls.InsecureCipherSuites(): accepted with a warning. This OpenSSL may not offer some (RC4, 3DES).
INSECURE_SUITES: dict[str, str] = {
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
}


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


def tls_options(min_version: str | None, cipher_suites: str | None, ignored: list[str]) -> TlsOptions:
    """Resolve the two flags (None or "": the default). Suites that change nothing are appended to `ignored`, with
    the reason. Raises FlagError for an unknown or refused version, an unknown suite name, or an empty list."""
    minimum = _min_version(min_version or DEFAULT_MIN_VERSION)
    if not cipher_suites:
        return TlsOptions(minimum)
    names = [name.strip() for name in cipher_suites.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECURE_SUITES and name not in INSECURE_SUITES]
    if unknown or not names:
        raise FlagError(
            f"argument --tls-cipher-suites: unknown cipher suite {', '.join(unknown) or repr(cipher_suites)}; "
            "use Go's crypto/tls names, such as TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"
        )
    if minimum == ssl.TLSVersion.TLSv1_3:
        ignored.append(
            f"--tls-cipher-suites={cipher_suites} "
            "(--tls-min-version=VersionTLS13: the TLS 1.3 suites are not configurable)"
        )
        return TlsOptions(minimum)
    chosen: list[str] = []
    for name in names:
        openssl_name = SECURE_SUITES.get(name) or INSECURE_SUITES.get(name)
        if openssl_name is None:
            continue  # a TLS 1.3 suite: always on
        if not _available(openssl_name):
            ignored.append(f"--tls-cipher-suites: {name} (not offered by {ssl.OPENSSL_VERSION})")
        elif openssl_name not in chosen:
            chosen.append(openssl_name)
    insecure = tuple(name for name in names if name in INSECURE_SUITES and INSECURE_SUITES[name] in chosen)
    if not chosen:
        # No TLS 1.2 suite to agree on: TLS 1.2 clients fail, as they would with Go given only TLS 1.3 suites.
        return TlsOptions(ssl.TLSVersion.TLSv1_3)
    return TlsOptions(minimum, ":".join(chosen), insecure)


def _min_version(name: str) -> ssl.TLSVersion:
    if name in MIN_VERSIONS:
        return MIN_VERSIONS[name]
    if name in REFUSED_VERSIONS:
        raise FlagError(
            f"argument --tls-min-version: {name} is not served: TLS 1.0 and 1.1 are disabled in OpenSSL 3 and "
            "deprecated in Python; use VersionTLS12 or VersionTLS13"
        )
    raise FlagError(f"argument --tls-min-version: unknown TLS version {name!r}; use VersionTLS12 or VersionTLS13")


def _available(openssl_name: str) -> bool:
    """Whether this OpenSSL, at its configured security level, can negotiate the suite."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(openssl_name)
    except ssl.SSLError:
        return False
    return True
