"""The API client takes its proxy from the environment once, as client-go does, and its HTTP session then makes no
per-request environment lookups (~/.netrc, proxy variables), which would cost two thread hops per request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from ipam_provider.runtime.kube.client import KubeClient, proxy_from_environment

API = "https://10.1.2.3:6443"


def configuration(host: str = API, proxy: str | None = None) -> client.Configuration:
    found = client.Configuration()
    found.host = host
    found.proxy = proxy
    return found


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def test_https_proxy_is_taken_for_the_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")
    found = configuration()
    proxy_from_environment(found)
    assert found.proxy == "http://proxy.example:3128"
    assert found.proxy_headers == {"Proxy-Authorization": "Basic dXNlcjpzZWNyZXQ="}


def test_no_proxy_covering_the_host_or_no_variable_means_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    unset = configuration()
    proxy_from_environment(unset)
    assert unset.proxy is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "10.1.2.3")
    bypassed = configuration()
    proxy_from_environment(bypassed)
    assert bypassed.proxy is None


def test_the_kubeconfig_proxy_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    named = configuration(proxy="http://named.example:8080")
    proxy_from_environment(named)
    assert named.proxy == "http://named.example:8080"


async def test_the_session_makes_no_per_request_environment_lookups() -> None:
    kube = KubeClient(client.ApiClient(configuration()))
    try:
        assert kube._api.rest_client.pool_manager.trust_env is False
    finally:
        await kube.close()


LOAD_IN_A_FRESH_PROCESS = """
import asyncio, sys
from ipam_provider.runtime.kube.client import KubeClient

async def main() -> None:
    kube = await KubeClient.from_kubeconfig(sys.argv[1])
    print(kube.host)
    await kube.close()

asyncio.run(main())
generated = ("kubernetes_asyncio.client.models.", "kubernetes_asyncio.client.api.")
print(sum(1 for module in sys.modules if module.startswith(generated)))
"""


def test_a_kubeconfig_loads_without_the_generated_models_imported(tmp_path: Path) -> None:
    """kubernetes-asyncio's generated API classes and models are 33 MiB of the process and unused: the client loads a
    kubeconfig without them (ipam_provider/runtime/kube/__init__.py)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://10.1.2.3:6443', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: abc}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", LOAD_IN_A_FRESH_PROCESS, str(kubeconfig)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [API, "0"]
