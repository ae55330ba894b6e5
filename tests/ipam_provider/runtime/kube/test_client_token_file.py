"""The in-cluster service account token is read again whenever the kubelet projects a new one (a `..data` symlink
swap), before the next request; an unreadable file keeps the last token. (Against the API server, with a token that
expires: tests/system/test_token_rotation.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.config import incluster_config

from ipam_provider.runtime.kube import client as client_module
from ipam_provider.runtime.kube.client import KubeClient, TokenFile
from ipam_provider.runtime.serving.certificates import self_signed_pem


def project(directory: Path, generation: int, token: str) -> None:
    data = directory / f"..{generation}"
    data.mkdir(parents=True)
    (data / "token").write_text(token)
    (data / "ca.crt").write_bytes(self_signed_pem("ca.example")[0])
    staged = directory / "..data_tmp"
    staged.symlink_to(data.name)
    staged.replace(directory / "..data")
    for name in ("token", "ca.crt"):
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")


async def sent(configuration: client.Configuration) -> str:
    return str((await configuration.auth_settings())["BearerToken"]["value"])


async def test_each_projected_token_is_sent_from_the_next_request_on(tmp_path: Path) -> None:
    project(tmp_path, 1, "first\n")
    configuration = client.Configuration()
    configuration.api_key["BearerToken"] = "Bearer first"
    configuration.refresh_api_key_hook = TokenFile(str(tmp_path / "token"), 0.0)
    assert await sent(configuration) == "Bearer first"
    project(tmp_path, 2, "second")
    assert await sent(configuration) == "Bearer second"
    project(tmp_path, 3, "third")
    assert await sent(configuration) == "Bearer third"


async def test_the_file_is_looked_at_once_per_check_interval(tmp_path: Path) -> None:
    project(tmp_path, 1, "first")
    configuration = client.Configuration()
    configuration.refresh_api_key_hook = TokenFile(str(tmp_path / "token"), 3600.0)
    configuration.api_key["BearerToken"] = "Bearer none"
    assert await sent(configuration) == "Bearer first"
    project(tmp_path, 2, "second")
    assert await sent(configuration) == "Bearer first", "not looked at again within the interval"


async def test_an_unreadable_token_file_keeps_the_last_token_and_is_logged_once(tmp_path: Path) -> None:
    project(tmp_path, 1, "first")
    configuration = client.Configuration()
    configuration.refresh_api_key_hook = TokenFile(str(tmp_path / "token"), 0.0)
    configuration.api_key["BearerToken"] = "Bearer none"
    assert await sent(configuration) == "Bearer first"
    (tmp_path / "..data").unlink()
    with structlog.testing.capture_logs() as logs:
        assert await sent(configuration) == "Bearer first"
        assert await sent(configuration) == "Bearer first"
    assert [entry["event"] for entry in logs] == ["cannot read the service account token, keeping the last one"]
    assert "first" not in str(logs)
    project(tmp_path, 2, "second")
    assert await sent(configuration) == "Bearer second"


async def test_the_in_cluster_configuration_follows_the_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project(tmp_path, 1, "first")
    monkeypatch.setattr(client_module, "TOKEN_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    kube = await KubeClient.from_kubeconfig()
    try:
        configuration = kube._api.configuration
        assert kube.host == "https://10.0.0.1:443"
        assert await sent(configuration) == "Bearer first"
        project(tmp_path, 2, "second")
        assert await sent(configuration) == "Bearer second"
    finally:
        await kube.close()
