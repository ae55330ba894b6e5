"""`--webhook-cert-name` and `--webhook-key-name` name the webhook's files in `--webhook-cert-dir`, as
controller-runtime's webhook.Options CertName and KeyName do (defaults `tls.crt` and `tls.key`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ipam_provider.flags import parse_args
from ipam_provider.runtime.serving.certificates import ServingCertificate, self_signed_pem
from ipam_provider.runtime.serving.webhook import WebhookServer
from tests.ipam_provider.runtime.serving.test_endpoint import served_name


def write(path: Path, hostname: str, key_path: Path) -> None:
    cert, key = self_signed_pem(hostname)
    path.write_bytes(cert)
    key_path.write_bytes(key)


async def test_the_webhook_serves_the_files_its_flags_name(tmp_path: Path) -> None:
    # A default-named pair beside the named one: serving "default.example" would mean the names were not read.
    write(tmp_path / "tls.crt", "default.example", tmp_path / "tls.key")
    write(tmp_path / "serving.pem", "named.example", tmp_path / "serving-key.pem")
    args = parse_args(
        [
            "run",
            f"--webhook-cert-dir={tmp_path}",
            "--webhook-cert-name=serving.pem",
            "--webhook-key-name=serving-key.pem",
        ]
    )
    files = args.options.webhook.cert
    assert (files.cert, files.key) == (tmp_path / "serving.pem", tmp_path / "serving-key.pem")
    server = WebhookServer(ServingCertificate.load(files, args.options.metrics.tls))
    await server.start("127.0.0.1", 0)
    try:
        assert await asyncio.to_thread(served_name, server.port) == "named.example"
    finally:
        await server.close()


def test_empty_names_and_directory_are_controller_runtimes_defaults() -> None:
    # The Go provider declares all three with "" as default, which controller-runtime reads as its defaults.
    files = parse_args(
        ["run", "--webhook-cert-dir=", "--webhook-cert-name=", "--webhook-key-name="]
    ).options.webhook.cert
    assert str(files.cert) == "/tmp/k8s-webhook-server/serving-certs/tls.crt"
    assert str(files.key) == "/tmp/k8s-webhook-server/serving-certs/tls.key"
