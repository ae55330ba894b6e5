"""The webhook and the metrics endpoint serve a certificate replaced on disk without a restart, as cert-manager
renews the Secret mounted at --webhook-cert-dir and --metrics-cert-path: the servers look at the files on their
own (nothing calls `refresh()` here), and a new TLS connection gets the new certificate."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ipam_provider.runtime.serving import endpoint
from ipam_provider.runtime.serving.certificates import CertificateFiles, ServingCertificate, self_signed_pem
from ipam_provider.runtime.serving.endpoint import MetricsEndpoint
from ipam_provider.runtime.serving.webhook import WebhookServer
from tests.ipam_provider.runtime.serving.test_endpoint import served_name


class SecretVolume:
    """A directory as the kubelet writes a Secret volume: `tls.crt` and `tls.key` are symlinks into `..data`,
    which an update swaps atomically (a rename) to a new directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.generation = 0

    def write(self, hostname: str) -> None:
        self.generation += 1
        data = self.directory / f"..{self.generation}"
        data.mkdir(parents=True)
        cert, key = self_signed_pem(hostname)
        (data / "tls.crt").write_bytes(cert)
        (data / "tls.key").write_bytes(key)
        staged = self.directory / "..data_tmp"
        staged.symlink_to(data.name)
        staged.replace(self.directory / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.directory / name).is_symlink():
                (self.directory / name).symlink_to(f"..data/{name}")


async def served_eventually(port: int, hostname: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (served := await asyncio.to_thread(served_name, port)) != hostname:
        assert time.monotonic() < deadline, f"still serving {served}, not {hostname}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("make", [WebhookServer, MetricsEndpoint], ids=["webhook", "metrics"])
async def test_a_certificate_replaced_on_disk_is_served_without_a_restart(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[ServingCertificate], WebhookServer | MetricsEndpoint],
) -> None:
    monkeypatch.setattr(endpoint, "CERT_CHECK_SECONDS", 0.05)
    volume = SecretVolume(tmp_path / "certs")
    volume.write("first.example")
    server = make(ServingCertificate.load(CertificateFiles(str(volume.directory))))
    await server.start("127.0.0.1", 0)
    try:
        assert await asyncio.to_thread(served_name, server.port) == "first.example"
        volume.write("renewed.example")
        await served_eventually(server.port, "renewed.example")
        volume.write("renewed-again.example")
        await served_eventually(server.port, "renewed-again.example")
    finally:
        await server.close()
