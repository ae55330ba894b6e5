"""Failures end to end (real API server, real controller, real NetBox): a crash between NetBox's allocation and the
IPAddress, a bad token, a missing source, and NetBox stopped in the middle of a run. After each, nothing is
allocated twice, nothing leaks, and the pools and claims say what is wrong, then recover.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any

from backends.netbox.spec import ANNOTATION_IP_ID, CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import EVENTS, SECRETS
from tests.support.cluster import wait_for
from tests.support.netbox_backend import (
    NB_POOLS,
    claim_uid_of,
    create_secret,
    delete_claim,
    get_or_create_field,
    get_or_create_tag,
    nb_claim,
    netbox_pool,
    owned_addresses,
    prefix,
    wait_pool_reason,
)
from tests.support.objects import wait_address, wait_claim_reason

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer


async def assert_netbox_matches_cluster(kube: KubeClient, namespace: str, netbox: NetBoxServer, parent: str) -> None:
    """Every IPAddress has exactly one NetBox address with its claim's UID, and NetBox holds no other of ours."""
    addresses, _ = await kube.list(ADDRESSES, namespace)
    claims = {c["metadata"]["name"]: c["metadata"]["uid"] for c in (await kube.list(CLAIMS, namespace))[0]}
    ours = owned_addresses(netbox, parent=parent)
    by_uid = collections.Counter(claim_uid_of(r) for r in ours)
    assert all(n == 1 for n in by_uid.values()), f"a claim holds several NetBox addresses: {by_uid}"
    in_netbox = {claim_uid_of(r): str(r.address).split("/")[0] for r in ours}
    in_cluster = {claims[a["spec"]["claimRef"]["name"]]: a["spec"]["address"] for a in addresses}
    assert in_netbox == in_cluster


async def test_address_made_before_a_crash_is_used_after_the_restart(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    created = netbox.create_prefix("10.60.0.0/29")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("crash", [prefix("10.60.0.0/29")]), namespace)
    claim = await kube.create(CLAIMS, nb_claim("survivor", "crash"), namespace)
    uid = claim["metadata"]["uid"]
    # What the backend does before the crash: the ownership marks, then the POST. The IPAddress is never written.
    tag = get_or_create_tag(netbox, OWNER_TAG)
    get_or_create_field(netbox, CLAIM_UID_FIELD, unique=True, filter_logic="exact")
    netbox.api().ipam.ip_addresses.create(address="10.60.0.1/29", description="someone else's")
    before_crash = created.available_ips.create({"tags": [tag.id], "custom_fields": {CLAIM_UID_FIELD: uid}})
    assert before_crash.address == "10.60.0.2/29"
    async with netbox_controller():
        await kube.create(CLAIMS, nb_claim("newcomer", "crash"), namespace)
        address = await wait_address(kube, namespace, "survivor")
        assert address["spec"]["address"] == "10.60.0.2"
        assert address["metadata"]["annotations"][ANNOTATION_IP_ID] == str(before_crash.id)
        newcomer = await wait_address(kube, namespace, "newcomer")
        assert newcomer["spec"]["address"] == "10.60.0.3"
        await assert_netbox_matches_cluster(kube, namespace, netbox, "10.60.0.0/29")
        await delete_claim(kube, namespace, "survivor")
        await delete_claim(kube, namespace, "newcomer")
        assert owned_addresses(netbox, parent="10.60.0.0/29") == []


async def test_bad_token_then_fixed(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any, fast_pool_resync: None
) -> None:
    netbox.create_prefix("10.61.0.0/29")
    bad = netbox.token[:-6] + "abcdef"
    await create_secret(kube, namespace, netbox, token=bad)
    await kube.create(NB_POOLS, netbox_pool("auth", [prefix("10.61.0.0/29")]), namespace)
    async with netbox_controller() as controller:
        await kube.create(CLAIMS, nb_claim("waits", "auth"), namespace)
        pool = await wait_pool_reason(kube, namespace, "auth", "AuthenticationFailed")
        claim = await wait_claim_reason(kube, namespace, "waits", "PoolNotReady")
        await controller.context.recorder.flush()
        events, _ = await kube.list(EVENTS, namespace)
        texts = [str(pool["status"]), str(claim["status"]), *(str(e.get("message")) for e in events)]
        assert any("token" in t for t in texts)
        for text in texts:
            assert bad.split(".")[-1] not in text and netbox.token.split(".")[-1] not in text
        await kube.patch(SECRETS, "netbox", {"stringData": {"token": netbox.token}}, namespace)
        await wait_pool_reason(kube, namespace, "auth", "PoolReady")
        address = await wait_address(kube, namespace, "waits", timeout=90)
        assert address["spec"]["address"] == "10.61.0.1"


async def test_missing_source_then_created(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any, fast_pool_resync: None
) -> None:
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("missing", [prefix("10.62.0.0/29")]), namespace)
    async with netbox_controller():
        await kube.create(CLAIMS, nb_claim("early", "missing"), namespace)
        pool = await wait_pool_reason(kube, namespace, "missing", "SourceNotFound")
        assert "10.62.0.0/29" in pool["status"]["conditions"][0]["message"]
        await wait_claim_reason(kube, namespace, "early", "PoolNotReady")
        netbox.create_prefix("10.62.0.0/29")
        await wait_pool_reason(kube, namespace, "missing", "PoolReady")
        assert (await wait_address(kube, namespace, "early", timeout=90))["spec"]["address"] == "10.62.0.1"


async def test_netbox_stopped_mid_run(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any, fast_pool_resync: None
) -> None:
    netbox.require_harness("stopping NetBox mid-run")
    netbox.create_prefix("10.63.0.0/24")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("outage", [prefix("10.63.0.0/24")]), namespace)
    async with netbox_controller():
        for i in range(5):
            await kube.create(CLAIMS, nb_claim(f"before-{i}", "outage"), namespace)
        for i in range(5):
            await wait_address(kube, namespace, f"before-{i}")
        await wait_pool_reason(kube, namespace, "outage", "PoolReady")

        await netbox.stop_web(kill=True)  # like a crash: connections refused from now on
        try:
            for i in range(5):
                await kube.create(CLAIMS, nb_claim(f"during-{i}", "outage"), namespace)
            await kube.delete(CLAIMS, "before-0", namespace)  # a release that cannot happen yet
            pool = await wait_pool_reason(kube, namespace, "outage", "NetBoxUnreachable")
            assert "cannot reach NetBox" in pool["status"]["conditions"][0]["message"]
            for i in range(5):
                claim = await wait_claim_reason(kube, namespace, f"during-{i}", "PoolNotReady")
                assert "NetBox" in claim["status"]["conditions"][0]["message"]
            await asyncio.sleep(2)
            assert await kube.get(CLAIMS, "before-0", namespace) is not None, "released without NetBox"
        finally:
            await netbox.start_web()

        await wait_pool_reason(kube, namespace, "outage", "PoolReady")
        for i in range(5):
            await wait_address(kube, namespace, f"during-{i}", timeout=90)

        async def released() -> bool:
            return await kube.get(CLAIMS, "before-0", namespace) is None

        await wait_for(released, timeout=90, message="claim before-0 to be released once NetBox is back")
        await assert_netbox_matches_cluster(kube, namespace, netbox, "10.63.0.0/24")
        assert len(owned_addresses(netbox, parent="10.63.0.0/24")) == 9
