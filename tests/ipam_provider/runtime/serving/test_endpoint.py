"""The metrics endpoint's certificate (files, reloaded on change, or self-signed), its plain-HTTP form, and the
pieces of its request checks that need no API server (the review cache, the Authorization header)."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import tempfile
from pathlib import Path

import aiohttp
import pytest
import structlog
from cryptography import x509
from cryptography.x509.oid import NameOID

from ipam_provider.runtime.serving.certificates import (
    CertificateError,
    CertificateFiles,
    ServingCertificate,
    self_signed_pem,
)
from ipam_provider.runtime.serving.endpoint import MetricsEndpoint, bearer_token, refresh_certificate
from ipam_provider.runtime.serving.reviews import TtlCache


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_pair(directory: Path, hostname: str, cert: str = "tls.crt", key: str = "tls.key") -> None:
    cert_pem, key_pem = self_signed_pem(hostname)
    (directory / cert).write_bytes(cert_pem)
    (directory / key).write_bytes(key_pem)


def served_name(port: int) -> str:
    """The common name of the certificate a new TLS connection to 127.0.0.1:port is served."""
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
        client.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    (name,) = x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(name.value)


async def test_the_files_are_served_and_reloaded_when_they_change(tmp_path: Path) -> None:
    write_pair(tmp_path, "first.example")
    certificate = ServingCertificate.load(CertificateFiles(str(tmp_path)))
    endpoint = MetricsEndpoint(certificate)
    port = free_port()
    await endpoint.start("127.0.0.1", port)
    try:
        assert await asyncio.to_thread(served_name, port) == "first.example"
        assert not certificate.refresh(), "unchanged files are not loaded again"

        # cert-manager's rotation, as kubelet writes a Secret volume: new files swapped in under the same names.
        rotated = tmp_path / "rotated"
        rotated.mkdir()
        write_pair(rotated, "second.example")
        for name in ("tls.crt", "tls.key"):
            (rotated / name).replace(tmp_path / name)
        assert certificate.refresh()
        assert await asyncio.to_thread(served_name, port) == "second.example"

        # A broken rotation (a key that is not the certificate's) keeps the served pair, and is not retried.
        other = tmp_path / "other"
        other.mkdir()
        write_pair(other, "third.example")
        (other / "tls.key").replace(tmp_path / "tls.key")
        assert not certificate.refresh()
        assert not certificate.refresh()
        assert await asyncio.to_thread(served_name, port) == "second.example"
        (other / "tls.crt").replace(tmp_path / "tls.crt")  # the pair completed
        assert certificate.refresh()
        assert await asyncio.to_thread(served_name, port) == "third.example"
    finally:
        await endpoint.close()


async def test_without_files_a_self_signed_certificate_is_served_until_they_appear(tmp_path: Path) -> None:
    certificate = ServingCertificate.load(CertificateFiles(str(tmp_path), "server.pem", "server-key.pem"))
    endpoint = MetricsEndpoint(certificate)
    port = free_port()
    await endpoint.start("127.0.0.1", port)
    try:
        assert await asyncio.to_thread(served_name, port) == socket.gethostname()
        assert not certificate.refresh()
        write_pair(tmp_path, "issued.example", "server.pem", "server-key.pem")  # the optional Secret arrives
        assert certificate.refresh()
        assert await asyncio.to_thread(served_name, port) == "issued.example"
    finally:
        await endpoint.close()


def test_the_self_signed_certificate_names_this_host(tmp_path: Path) -> None:
    cert = x509.load_pem_x509_certificate(self_signed_pem("node-1")[0])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["node-1", "localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert ServingCertificate.load(CertificateFiles(None)).context.minimum_version == ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize("broken", ["not-pem", "mismatched", "key-missing"])
def test_unusable_files_are_an_error_at_start(tmp_path: Path, broken: str) -> None:
    write_pair(tmp_path, "a.example")
    if broken == "not-pem":
        (tmp_path / "tls.crt").write_text("not a certificate\n")
    elif broken == "mismatched":
        (tmp_path / "tls.key").write_bytes(self_signed_pem("b.example")[1])
    else:
        (tmp_path / "tls.key").unlink()
    with pytest.raises(CertificateError, match=str(tmp_path)):
        ServingCertificate.load(CertificateFiles(str(tmp_path)))


async def test_plain_http_needs_no_token() -> None:
    endpoint = MetricsEndpoint(None)
    port = free_port()
    await endpoint.start("127.0.0.1", port)
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert "process_cpu_seconds_total" in await response.text()
    finally:
        await endpoint.close()


async def test_the_secure_endpoint_answers_503_until_it_can_review() -> None:
    endpoint = MetricsEndpoint(ServingCertificate.load(CertificateFiles(None)))
    port = free_port()
    await endpoint.start("127.0.0.1", port)
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"https://127.0.0.1:{port}/metrics", ssl=False) as response,
        ):
            assert response.status == 503 and "not connected to the API server" in await response.text()
    finally:
        await endpoint.close()


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def", "abc.def"),
        ("bearer  abc ", "abc"),
        ("BEARER abc", "abc"),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("", None),
    ],
)
def test_bearer_token(header: str, token: str | None) -> None:
    assert bearer_token(header) == token


def test_the_review_cache_expires_and_is_bounded() -> None:
    now = [0.0]
    cache: TtlCache[str, int] = TtlCache(5.0, 2, clock=lambda: now[0])
    cache.put("a", 1)
    assert cache.get("a") == (True, 1)
    now[0] = 4.9
    assert cache.get("a") == (True, 1)
    now[0] = 5.0
    assert cache.get("a") == (False, None) and len(cache) == 0
    for key, value in (("a", 1), ("b", 2), ("c", 3)):
        cache.put(key, value)
    assert len(cache) == 2 and cache.get("a") == (False, None) and cache.get("c") == (True, 3)


async def test_a_failed_look_at_the_files_is_logged_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pair(tmp_path, "first.example")
    certificate = ServingCertificate.load(CertificateFiles(str(tmp_path)))
    endpoint = MetricsEndpoint(certificate)
    port = free_port()
    await endpoint.start("127.0.0.1", port)
    try:
        rotated = tmp_path / "rotated"
        rotated.mkdir()
        write_pair(rotated, "second.example")
        for name in ("tls.crt", "tls.key"):
            (rotated / name).replace(tmp_path / name)

        def no_space(*_: object, **__: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(tempfile, "TemporaryDirectory", no_space)  # where the PEM passes on its way to OpenSSL
        with structlog.testing.capture_logs() as records:
            refresh_certificate(certificate)  # does not raise: the watch loop lives on
        assert [r["log_level"] for r in records] == ["error"] and "No space left" in records[0]["error"]
        assert await asyncio.to_thread(served_name, port) == "first.example"

        monkeypatch.undo()
        refresh_certificate(certificate)  # the same files, tried again
        assert await asyncio.to_thread(served_name, port) == "second.example"
    finally:
        await endpoint.close()
