"""The NetBox backend's Secrets and connections against the real API server (no NetBox: the Secrets name a port
where nothing listens, and a client is made without a request): which Secrets a pool may read, what a Secret may
make the controller hold (a CA bundle parsed and bounded), connections closed and CA files removed when no pool uses
them any more, and the TLSVerified condition; then with the controller (and its webhook, registered as config/webhook
ships it), what a tenant sees of each.
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
from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.contract import PoolNotReadyError, PoolRef, ReportCondition
from ipam_provider.backend.tenancy import SECRET_REFS_LABEL
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS, SECRETS
from tests.ipam_provider.test_admission import labelled, refused, webhook
from tests.support.cluster import wait_for
from tests.support.netbox_backend import (
    GLOBAL_NB_POOLS,
    NB_POOLS,
    backend_factory,
    global_netbox_pool,
    lend_secrets,
    nb_claim,
    netbox_pool,
    new_claim,
    pool_of,
    prefix,
    wait_pool_reason,
)
from tests.support.objects import ready_condition, wait_claim_reason
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


async def test_a_pool_gone_is_only_lent_a_client(backend: NetboxBackend, kube: KubeClient, namespace: str) -> None:
    await create_secret(kube, namespace, "netbox")
    pool = pool_of(namespace, "pool", SOURCES)
    backend.observe_pool(NETBOX_POOL, None, pool)
    # An operation under way when the pool goes borrows its client to the end...
    async with backend.resolver.connections.use(parsed(backend, pool)) as client:
        backend.observe_pool(NETBOX_POOL, pool, None)
        assert not client.closed
    await closed(client)  # ... which keeps none for the pool that is gone.
    backend.observe_pool(NETBOX_POOL, None, pool)  # a pool of that name again: its client is kept
    async with backend.resolver.connections.use(parsed(backend, pool)) as again:
        pass
    assert again is not client and not again.closed


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


# --- with the controller, as a tenant sees it ------------------------------------------------------------------


async def conditions_and_events(kube: KubeClient, namespace: str) -> str:
    """Everything a tenant reads back in `namespace` and of cluster-scoped pools: conditions and Event messages."""
    events = (await kube.list(EVENTS, namespace))[0] + (await kube.list(EVENTS, "default"))[0]
    texts = [str(event.get("message")) for event in events]
    for resource, where in ((CLAIMS, namespace), (NB_POOLS, namespace), (GLOBAL_NB_POOLS, None)):
        texts += [str((o.get("status") or {}).get("conditions")) for o in (await kube.list(resource, where))[0]]
    return "\n".join(texts)


async def test_a_global_pool_on_a_namespace_that_lends_nothing_says_so_on_itself_and_its_claims(
    kube: KubeClient, namespace: str, netbox_controller: Any, fast_pool_resync: None
) -> None:
    await create_secret(kube, namespace, "netbox", url=f"{CLOSED}/team-b-secret-url", token="team-b-token")
    name = f"global-{namespace}"
    await kube.create(GLOBAL_NB_POOLS, global_netbox_pool(name, SOURCES, "netbox", namespace))
    try:
        async with netbox_controller():
            claim_body = nb_claim("c", name)
            claim_body["spec"]["poolRef"]["kind"] = GLOBAL_NB_POOLS.kind
            await kube.create(CLAIMS, claim_body, namespace)
            pool = await wait_pool_reason(kube, None, name, "SecretNotAllowed", resource=GLOBAL_NB_POOLS)
            message = (ready_condition(pool) or {}).get("message", "")
            assert SECRET_REFS_LABEL in message, message
            claim = await wait_claim_reason(kube, namespace, "c", "PoolNotReady")
            assert (ready_condition(claim) or {}).get("message") == message
            seen = await conditions_and_events(kube, namespace)
            assert "team-b-secret-url" not in seen and "127.0.0.1:9" not in seen and "team-b-token" not in seen, seen
            await lend_secrets(kube, namespace)  # now it may: the pool reaches for NetBox (where nothing listens)
            await wait_pool_reason(kube, None, name, "NetBoxUnreachable", resource=GLOBAL_NB_POOLS)
    finally:
        await kube.delete(GLOBAL_NB_POOLS, name)


async def test_plain_http_is_a_warning_condition_and_event(
    kube: KubeClient, namespace: str, netbox_controller: Any
) -> None:
    await create_secret(kube, namespace, "netbox", url="http://127.0.0.1:9")
    await kube.create(NB_POOLS, netbox_pool("plain", SOURCES), namespace)
    async with netbox_controller():

        async def warned() -> list[Object]:
            events = (await kube.list(EVENTS, namespace))[0]
            return [e for e in events if (e.get("type"), e.get("reason")) == ("Warning", "PlainHTTP")]

        (event,) = await wait_for(warned, timeout=60, message="a PlainHTTP Warning Event")
        assert event["involvedObject"]["name"] == "plain", event
        pool = await kube.get(NB_POOLS, "plain", namespace)
        conditions = {c["type"]: c for c in (pool or {})["status"]["conditions"]}
        assert (conditions["TLSVerified"]["status"], conditions["TLSVerified"]["reason"]) == ("False", "PlainHTTP")


def nested_objects(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"n": value}
    return value


async def test_the_webhook_refuses_custom_fields_too_deep_on_create_and_update(
    kube: KubeClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    async with webhook(kube, kubeconfig, namespace, tmp_path, extra_backends=[backend_factory()]) as label:

        def with_depth(name: str, levels: int) -> Object:
            fields = {"customFields": {"f": nested_objects(levels)}}
            return labelled(netbox_pool(name, SOURCES, addressFields=fields), label)

        deep = with_depth("deep", 200)  # the test's client (orjson) sends at most 254 levels
        refusal = await refused(kube.create(NB_POOLS, deep, namespace))
        assert refusal.status == 422 and "customFields.f.n.n.n.n.n.n.n.n: nested deeper than 8" in refusal.message
        assert await kube.get(NB_POOLS, "deep", namespace) is None
        await kube.create(NB_POOLS, with_depth("shallow", 8), namespace)
        deeper = {"spec": {"addressFields": {"customFields": {"f": nested_objects(9)}}}}
        refusal = await refused(kube.patch(NB_POOLS, "shallow", deeper, namespace))
        assert refusal.status == 422 and "nested deeper than 8" in refusal.message, refusal.message
