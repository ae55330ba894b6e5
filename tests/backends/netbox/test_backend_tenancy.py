"""The NetBox backend's Secrets and connections against the real API server (no NetBox: the Secrets name a port
where nothing listens, and a client is made without a request): which Secrets a pool may read, what a Secret may
make the controller hold (a CA bundle parsed and bounded), connections closed and CA files removed when no pool uses
them any more, and the TLSVerified condition.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from backends.netbox import NetboxBackend
from backends.netbox.client import NetboxClient
from backends.netbox.reasons import PoolUnusableError
from backends.netbox.spec import NETBOX_POOL, Pool
from ipam_provider.backend.contract import PoolNotReadyError, PoolRef, ReportCondition
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import SECRETS
from tests.backends.netbox.conftest import global_netbox_pool, lend_secrets, new_claim, pool_of, prefix
from tests.support.cluster import wait_for
from tools.controlplane.pki import write_pki

Object = dict[str, Any]
CLOSED = "https://127.0.0.1:9"  # nothing listens here
SOURCES = [prefix("10.0.0.0/24")]


async def create_secret(kube: KubeClient, namespace: str, name: str, **data: str) -> None:
    body = {"metadata": {"name": name}, "stringData": {"url": CLOSED, "token": "a-token", **data}}
    await kube.create(SECRETS, body, namespace)


def parsed(backend: NetboxBackend, pool: Object) -> Pool:
    return backend.resolver.parse(PoolRef.from_object(pool), pool)


async def client_for(backend: NetboxBackend, pool: Object) -> NetboxClient:
    return await backend.resolver.connections.client(parsed(backend, pool))


async def closed(client: NetboxClient) -> None:
    async def probe() -> bool:
        return client.closed

    await wait_for(probe, timeout=10, interval=0.05, message="the client to be closed")


def ca_file(client: NetboxClient) -> Path:
    assert isinstance(client.endpoint.verify, str), client.endpoint.verify
    return Path(client.endpoint.verify)


@pytest.fixture
def ca_pem(tmp_path: Path) -> str:
    return write_pki(tmp_path)["ca"].read_text()


async def test_a_global_pool_reads_only_a_namespace_that_lends_its_secrets(
    backend: NetboxBackend, kube: KubeClient, namespace: str
) -> None:
    await create_secret(kube, namespace, "netbox", url=f"{CLOSED}/team-b-secret-url", token="team-b-token")
    own = pool_of(namespace, "own", SOURCES)
    shared = await client_for(backend, own)  # the Secret is read, and cached, for the namespace's own pool
    cluster_wide = global_netbox_pool("cluster-wide", SOURCES, "netbox", namespace)
    ref = PoolRef.from_object(cluster_wide)
    report = await backend.report(ref, cluster_wide, [])
    assert (report.ready, report.reason, report.conditions) == (False, "SecretNotAllowed", ()), report
    assert SECRET_REFS_LABEL in report.message and "team-b" not in report.message, report.message
    with pytest.raises(PoolNotReadyError) as refused:
        await backend.allocate(ref, cluster_wide, new_claim(namespace, "c"))
    assert refused.value.message == report.message
    await lend_secrets(kube, namespace)
    assert await client_for(backend, cluster_wide) is shared
    await lend_secrets(kube, namespace, lend=False)
    backend.resolver.connections.invalidate(parsed(backend, cluster_wide))
    with pytest.raises(PoolUnusableError, match=SECRET_REFS_LABEL):
        await client_for(backend, cluster_wide)
    assert not shared.closed, "the namespace's own pool still uses the client"
    backend.observe_pool(NETBOX_POOL, own, None)
    await closed(shared)


async def test_a_deleted_pool_closes_its_client_and_removes_its_ca_file(
    backend: NetboxBackend, kube: KubeClient, namespace: str, ca_pem: str
) -> None:
    await create_secret(kube, namespace, "netbox", caBundle=ca_pem)
    first, second = (pool_of(namespace, name, SOURCES) for name in ("first", "second"))
    client = await client_for(backend, first)
    assert await client_for(backend, second) is client and ca_file(client).read_text() == ca_pem
    backend.observe_pool(NETBOX_POOL, first, None)
    assert not client.closed and ca_file(client).exists(), "the second pool still uses the client"
    backend.observe_pool(NETBOX_POOL, second, None)
    await closed(client)
    assert not ca_file(client).exists()
    assert backend.resolver.connections._limits == {}, "the URL's semaphore stayed"


async def test_a_rotated_token_and_a_deleted_secret_close_the_clients_made_from_it(
    backend: NetboxBackend, kube: KubeClient, namespace: str, ca_pem: str
) -> None:
    await create_secret(kube, namespace, "netbox", caBundle=ca_pem)
    pool = pool_of(namespace, "pool", SOURCES)
    old = await client_for(backend, pool)
    await kube.patch(SECRETS, "netbox", {"stringData": {"token": "a-rotated-token"}}, namespace)
    backend.resolver.connections.invalidate(parsed(backend, pool))
    new = await client_for(backend, pool)
    assert new is not old
    await closed(old)
    assert not ca_file(old).exists() and ca_file(new).exists()
    await kube.delete(SECRETS, "netbox", namespace)
    backend.resolver.connections.invalidate(parsed(backend, pool))
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert (report.ready, report.reason) == (False, "SecretNotFound"), report
    await closed(new)
    assert not ca_file(new).exists()


async def test_a_pool_that_names_another_secret_gives_up_its_client(
    backend: NetboxBackend, kube: KubeClient, namespace: str
) -> None:
    await create_secret(kube, namespace, "a")
    await create_secret(kube, namespace, "b", token="another-token")
    before = await client_for(backend, pool_of(namespace, "pool", SOURCES, secret="a"))
    after = await client_for(backend, pool_of(namespace, "pool", SOURCES, secret="b"))
    assert after is not before
    await closed(before)
    assert not after.closed


async def test_a_ca_bundle_is_parsed_and_bounded(
    backend: NetboxBackend, kube: KubeClient, namespace: str, ca_pem: str
) -> None:
    not_pem = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
    cases = {
        "not-pem": (not_pem, "must hold PEM certificates"),
        "too-large": (ca_pem * (64 * 1024 // len(ca_pem) + 1), "at most 65536 (64 KiB)"),
    }
    for name, (bundle, hint) in cases.items():
        await create_secret(kube, namespace, name, caBundle=bundle)
        pool = pool_of(namespace, name, SOURCES, secret=name)
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        assert (report.ready, report.reason) == (False, "InvalidSecret"), report
        assert "caBundle" in report.message and hint in report.message, report.message
    await create_secret(kube, namespace, "commented", caBundle=f"our private CA:\n{ca_pem}\n# end\n")
    client = await client_for(backend, pool_of(namespace, "commented", SOURCES, secret="commented"))
    assert ca_file(client).read_text() == ca_pem, "the CA file holds more than the certificates"
    assert os.listdir(ca_file(client).parent) == [ca_file(client).name]


def tls_verified(conditions: Any) -> tuple[bool, str, bool]:
    (condition,) = [c for c in conditions if isinstance(c, ReportCondition) and c.type == "TLSVerified"]
    return condition.status, condition.reason, condition.warning


async def test_tls_off_is_a_warning_condition(backend: NetboxBackend, kube: KubeClient, namespace: str) -> None:
    await create_secret(kube, namespace, "plain", url="http://127.0.0.1:9")
    await create_secret(kube, namespace, "tls")
    insecure: Object = {"connection": {"secretRef": {"name": "tls"}, "insecureSkipVerify": True}}
    cases = [
        (pool_of(namespace, "plain", SOURCES, secret="plain"), (False, "PlainHTTP", True)),
        (pool_of(namespace, "insecure", SOURCES, **insecure), (False, "InsecureSkipVerify", True)),
        (pool_of(namespace, "verified", SOURCES, secret="tls"), (True, "Verified", False)),
    ]
    for pool, expected in cases:
        report = await backend.report(PoolRef.from_object(pool), pool, [])
        assert (report.ready, report.reason) == (False, "NetBoxUnreachable"), report
        assert tls_verified(report.conditions) == expected, report.conditions
    # Before its Secret can be read, a pool's own spec is enough to say that verification is off.
    missing: Object = {"connection": {"secretRef": {"name": "missing"}, "insecureSkipVerify": True}}
    pool = pool_of(namespace, "missing", SOURCES, **missing)
    report = await backend.report(PoolRef.from_object(pool), pool, [])
    assert report.reason == "SecretNotFound" and tls_verified(report.conditions) == (False, "InsecureSkipVerify", True)
