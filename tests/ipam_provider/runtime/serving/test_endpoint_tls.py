"""--tls-min-version and --tls-cipher-suites: their Go forms, the suite names' OpenSSL names, and real handshakes
against the HTTPS metrics endpoint."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from ipam_provider.runtime.flagforms import INSECURE_SUITES, SECURE_SUITES, FlagError, tls_options
from ipam_provider.runtime.serving.certificates import CertificateFiles, ServingCertificate, TlsOptions
from ipam_provider.runtime.serving.endpoint import MetricsEndpoint
from tests.ipam_provider.runtime.serving.test_endpoint import free_port, served_name, write_pair
from tests.support.tlsclient import handshake, refused

# The suites' IANA code points (RFC 5246, 5289, 7905, 8446 and the TLS Cipher Suites registry), to check each
# OpenSSL name in the table against OpenSSL's own idea of the suite.
IANA_CODE_POINTS = {
    "TLS_AES_128_GCM_SHA256": 0x1301,
    "TLS_AES_256_GCM_SHA384": 0x1302,
    "TLS_CHACHA20_POLY1305_SHA256": 0x1303,
    "TLS_RSA_WITH_RC4_128_SHA": 0x0005,
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": 0x000A,
    "TLS_RSA_WITH_AES_128_CBC_SHA": 0x002F,
    "TLS_RSA_WITH_AES_256_CBC_SHA": 0x0035,
    "TLS_RSA_WITH_AES_128_CBC_SHA256": 0x003C,
    "TLS_RSA_WITH_AES_128_GCM_SHA256": 0x009C,
    "TLS_RSA_WITH_AES_256_GCM_SHA384": 0x009D,
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": 0xC007,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": 0xC009,
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": 0xC00A,
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": 0xC011,
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": 0xC012,
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": 0xC013,
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": 0xC014,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": 0xC023,
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": 0xC027,
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": 0xC02B,
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": 0xC02C,
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": 0xC02F,
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": 0xC030,
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": 0xCCA8,
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": 0xCCA9,
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": 0xCCA8,
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": 0xCCA9,
}


def test_every_go_suite_name_is_known_once() -> None:
    assert set(SECURE_SUITES) | set(INSECURE_SUITES) == set(IANA_CODE_POINTS)
    assert not set(SECURE_SUITES) & set(INSECURE_SUITES)


@pytest.mark.parametrize("name", [n for n, o in {**SECURE_SUITES, **INSECURE_SUITES}.items() if o is not None])
def test_each_openssl_name_is_the_same_suite(name: str) -> None:
    """OpenSSL's suite of that name has the Go name's code point; suites this OpenSSL does not offer (RC4, 3DES)
    are the ones tls_options reports as not acted on."""
    openssl_name = SECURE_SUITES.get(name) or INSECURE_SUITES[name]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.set_ciphers(openssl_name)
    except ssl.SSLError:
        assert "RC4" in name or "3DES" in name, f"{openssl_name} should be offered"
        ignored: list[str] = []
        assert tls_options(None, name, ignored) == TlsOptions(ssl.TLSVersion.TLSv1_3)
        assert ignored == [f"--tls-cipher-suites: {name} (not offered by {ssl.OPENSSL_VERSION})"]
        return
    (tls12,) = [c for c in context.get_ciphers() if c["protocol"] != "TLSv1.3"]
    assert (tls12["name"], tls12["id"] & 0xFFFF) == (openssl_name, IANA_CODE_POINTS[name])


def test_the_tls_13_suites_are_openssls_tls_13_suites() -> None:
    names = {c["name"]: c["id"] & 0xFFFF for c in ssl.create_default_context().get_ciphers()}
    for name, openssl_name in SECURE_SUITES.items():
        if openssl_name is None:
            assert names[name] == IANA_CODE_POINTS[name]


def test_versions() -> None:
    assert tls_options(None, None, []) == TlsOptions(ssl.TLSVersion.TLSv1_2)
    assert tls_options("", "", []) == TlsOptions(ssl.TLSVersion.TLSv1_2)
    assert tls_options("VersionTLS12", None, []) == TlsOptions(ssl.TLSVersion.TLSv1_2)
    assert tls_options("VersionTLS13", None, []) == TlsOptions(ssl.TLSVersion.TLSv1_3)
    for old in ("VersionTLS10", "VersionTLS11"):
        with pytest.raises(FlagError, match=f"--tls-min-version: {old} is not served: TLS 1.0 and 1.1"):
            tls_options(old, None, [])
    for unknown in ("TLS13", "VersionTLS14", "1.2", "versiontls12"):
        with pytest.raises(FlagError, match=f"unknown TLS version '{unknown}'; use VersionTLS12 or VersionTLS13"):
            tls_options(unknown, None, [])


def test_cipher_suites() -> None:
    ignored: list[str] = []
    got = tls_options(
        None,
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,TLS_AES_128_GCM_SHA256,"
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305,TLS_RSA_WITH_AES_128_GCM_SHA256",
        ignored,
    )
    assert got == TlsOptions(
        ssl.TLSVersion.TLSv1_2,
        "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-CHACHA20-POLY1305:AES128-GCM-SHA256",
        ("TLS_RSA_WITH_AES_128_GCM_SHA256",),
    )
    assert ignored == []
    # Only TLS 1.3 suites: no TLS 1.2 suite is left to agree on, so only TLS 1.3 is served (as Go would).
    assert tls_options(None, "TLS_AES_128_GCM_SHA256", ignored) == TlsOptions(ssl.TLSVersion.TLSv1_3)
    # With TLS 1.3 as the minimum the list changes nothing, and is named so.
    assert tls_options("VersionTLS13", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", ignored) == TlsOptions(
        ssl.TLSVersion.TLSv1_3
    )
    assert ignored == [
        "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 "
        "(--tls-min-version=VersionTLS13: the TLS 1.3 suites are not configurable)"
    ]
    for bad, named in (
        ("TLS_FOO,TLS_AES_128_GCM_SHA256", "TLS_FOO"),
        ("ECDHE-RSA-AES128-GCM-SHA256", None),
        (",", None),
    ):
        with pytest.raises(FlagError, match="--tls-cipher-suites: unknown cipher suite") as raised:
            tls_options(None, bad, [])
        assert (named or bad) in str(raised.value)


@asynccontextmanager
async def serving(certificate: ServingCertificate) -> AsyncIterator[int]:
    endpoint = MetricsEndpoint(certificate)
    port = free_port()
    await endpoint.start("127.0.0.1", port)
    try:
        yield port
    finally:
        await endpoint.close()


async def test_tls_13_as_the_minimum_refuses_tls_12_clients(tmp_path: Path) -> None:
    tls12 = ssl.TLSVersion.TLSv1_2
    async with serving(ServingCertificate.load(CertificateFiles(None))) as default_port:
        assert (await asyncio.to_thread(handshake, default_port, tls12))[0] == "TLSv1.2", "the default takes TLS 1.2"

    write_pair(tmp_path, "first.example")
    certificate = ServingCertificate.load(CertificateFiles(str(tmp_path)), tls_options("VersionTLS13", None, []))
    async with serving(certificate) as port:
        assert (await asyncio.to_thread(handshake, port))[0] == "TLSv1.3"
        await asyncio.to_thread(refused, port, tls12)
        # A rotated certificate is served with the same options.
        rotated = tmp_path / "rotated"
        rotated.mkdir()
        write_pair(rotated, "second.example")
        for name in ("tls.crt", "tls.key"):
            (rotated / name).replace(tmp_path / name)
        assert certificate.refresh()
        assert await asyncio.to_thread(served_name, port) == "second.example"
        await asyncio.to_thread(refused, port, tls12)


async def test_a_tls_12_client_must_offer_a_listed_suite() -> None:
    """The self-signed certificate's key is EC, so the ECDSA suites are the ones it can negotiate."""
    tls12, listed, unlisted = ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384"
    async with serving(ServingCertificate.load(CertificateFiles(None))) as default_port:
        assert await asyncio.to_thread(handshake, default_port, tls12, unlisted) == ("TLSv1.2", unlisted)

    suites = tls_options(
        "VersionTLS12", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", []
    )
    async with serving(ServingCertificate.load(CertificateFiles(None), suites)) as port:
        assert await asyncio.to_thread(handshake, port, tls12, listed) == ("TLSv1.2", listed)
        await asyncio.to_thread(refused, port, tls12, unlisted)
        # TLS 1.3 clients are not limited by the list, as with Go.
        assert (await asyncio.to_thread(handshake, port))[0] == "TLSv1.3"
