"""The NetBox backend end to end: real API server, real controller, real NetBox 4.7.

Claims on NetboxIPPools get addresses that NetBox allocated (IPv4 and IPv6 prefixes, ip-ranges), with the pool's
metadata and our ownership marks on the NetBox objects; deleting a claim deletes its NetBox address and nothing
else; a full source falls through to the next one, and when all are full the claim reports PoolExhausted.
All tests of this module share one NetBox database, so each uses its own prefixes.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import TYPE_CHECKING, Any

from backends.netbox.spec import ANNOTATION_CLAIM_UID, ANNOTATION_IP_ID, CLAIM_UID_FIELD, OWNER_TAG
from ipam_provider.api.capi import CLAIMS, CLUSTERS, MACHINES
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.netbox_backend import (
    GLOBAL_NB_POOLS,
    NB_POOLS,
    claim_uid_of,
    create_secret,
    delete_claim,
    global_netbox_pool,
    ip_range,
    lend_secrets,
    nb_claim,
    netbox_pool,
    owned_addresses,
    prefix,
    record_gateway,
    unique_name,
    wait_pool_reason,
)
from tests.support.objects import cluster, wait_address, wait_claim_reason

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer


async def test_allocate_and_release_ipv4(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("10.40.0.0/29")
    manual = netbox.api().ipam.ip_addresses.create(address="10.40.0.1/29", description="made by hand")
    record_gateway(netbox, "10.40.0.6/29")  # a gateway inside the prefix must be in NetBox, or the pool is not Ready
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("v4", [prefix("10.40.0.0/29", gateway="10.40.0.6")]), namespace)
    async with netbox_controller():
        await kube.create(CLAIMS, nb_claim("one", "v4"), namespace)
        await kube.create(CLAIMS, nb_claim("two", "v4"), namespace)
        one = await wait_address(kube, namespace, "one")
        two = await wait_address(kube, namespace, "two")
        assert {one["spec"]["address"], two["spec"]["address"]} == {"10.40.0.2", "10.40.0.3"}
        assert one["spec"]["prefix"] == 29 and one["spec"]["gateway"] == "10.40.0.6"
        annotations = one["metadata"]["annotations"]
        claim_obj = await kube.get(CLAIMS, "one", namespace)
        assert claim_obj is not None
        assert annotations[ANNOTATION_CLAIM_UID] == claim_obj["metadata"]["uid"]
        record = netbox.api().ipam.ip_addresses.get(int(annotations[ANNOTATION_IP_ID]))
        assert record.address == f"{one['spec']['address']}/29"
        assert claim_uid_of(record) == claim_obj["metadata"]["uid"]
        assert OWNER_TAG in [t.slug for t in record.tags]

        pool = await wait_pool_reason(kube, namespace, "v4", "PoolReady")
        await wait_for(
            lambda: _pool_used(kube, namespace, "v4", 4), timeout=90, message="pool v4 to count 4 used addresses"
        )
        counted = await kube.get(NB_POOLS, "v4", namespace)
        assert counted is not None
        assert counted["status"]["ipAddresses"] == {"total": 6, "used": 4, "free": 2}
        assert pool["status"]["sources"][0]["range"] == "10.40.0.0/29"

        await delete_claim(kube, namespace, "one")
        assert netbox.api().ipam.ip_addresses.get(int(annotations[ANNOTATION_IP_ID])) is None
        assert [r.address for r in owned_addresses(netbox, parent="10.40.0.0/29")] == [f"{two['spec']['address']}/29"]
        await delete_claim(kube, namespace, "two")
        assert owned_addresses(netbox, parent="10.40.0.0/29") == []
    # The address made by hand is still there, untouched.
    kept = netbox.api().ipam.ip_addresses.get(manual.id)
    assert kept is not None and kept.description == "made by hand"


async def _pool_used(kube: KubeClient, namespace: str, name: str, used: int) -> bool:
    pool = await kube.get(NB_POOLS, name, namespace)
    return bool(pool and (pool.get("status") or {}).get("ipAddresses", {}).get("used") == used)


async def test_ipv6_prefix_and_ip_range(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("2001:db8:40::/64")
    record_gateway(netbox, "2001:db8:40::1/64")
    rng = netbox.create_ip_range("10.41.0.100/24", "10.41.0.101/24")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("v6", [prefix("2001:db8:40::/64", gateway="2001:db8:40::1")]), namespace)
    await kube.create(NB_POOLS, netbox_pool("range", [ip_range(id=rng.id)], prefixLength=16), namespace)
    async with netbox_controller():
        for name, pool in (("six-a", "v6"), ("six-b", "v6"), ("r-a", "range"), ("r-b", "range")):
            await kube.create(CLAIMS, nb_claim(name, pool), namespace)
        six = [await wait_address(kube, namespace, n) for n in ("six-a", "six-b")]
        assert sorted(a["spec"]["address"] for a in six) == ["2001:db8:40::2", "2001:db8:40::3"]
        assert all(a["spec"]["prefix"] == 64 for a in six)
        ranged = [await wait_address(kube, namespace, n) for n in ("r-a", "r-b")]
        assert sorted(a["spec"]["address"] for a in ranged) == ["10.41.0.100", "10.41.0.101"]
        assert all(a["spec"]["prefix"] == 16 for a in ranged)  # the pool's override of the range's /24
        await kube.create(CLAIMS, nb_claim("r-c", "range"), namespace)
        exhausted = await wait_claim_reason(kube, namespace, "r-c", "PoolExhausted")
        assert "ip-range #" in exhausted["status"]["conditions"][0]["message"]
        range_pool = await wait_pool_reason(kube, namespace, "range", "PoolReady")
        assert range_pool["status"]["sources"][0]["range"] == "10.41.0.100-10.41.0.101"


async def test_falls_through_to_the_next_source_then_exhausted(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("10.42.0.0/29")  # .1 to .6
    netbox.create_prefix("10.42.1.0/30")  # .1 and .2
    record_gateway(netbox, "10.42.0.1/29")
    record_gateway(netbox, "10.42.1.1/30")
    netbox.api().ipam.ip_addresses.create(address="10.42.0.6/29", description="by hand")
    await create_secret(kube, namespace, netbox)
    sources = [prefix("10.42.0.0/29", gateway="10.42.0.1"), prefix("10.42.1.0/30", gateway="10.42.1.1")]
    await kube.create(NB_POOLS, netbox_pool("two", sources), namespace)
    async with netbox_controller():
        names = [f"c{i}" for i in range(5)]
        for name in names:
            await kube.create(CLAIMS, nb_claim(name, "two"), namespace)
        got = {name: (await wait_address(kube, namespace, name))["spec"] for name in names}
        expected = ["10.42.0.2", "10.42.0.3", "10.42.0.4", "10.42.0.5", "10.42.1.2"]
        assert sorted(s["address"] for s in got.values()) == expected  # never a gateway
        for spec in got.values():  # each address has its own source's gateway
            network = ipaddress.ip_network(f"{spec['gateway']}/{spec['prefix']}", strict=False)
            assert ipaddress.ip_address(spec["address"]) in network
        await kube.create(CLAIMS, nb_claim("late", "two"), namespace)
        late = await wait_claim_reason(kube, namespace, "late", "PoolExhausted")
        message = late["status"]["conditions"][0]["message"]
        assert "10.42.0.0/29" in message and "10.42.1.0/30" in message
        # Room made in the first source is used again (a release resets the order).
        await delete_claim(kube, namespace, "c0")
        freed = got["c0"]["address"]
        late_address = await wait_address(kube, namespace, "late", timeout=90)
        assert late_address["spec"]["address"] == freed


async def test_metadata_on_the_netbox_object(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    tenant = netbox.create_tenant("Acme Corp", slug=unique_name("acme"))
    tag = netbox.create_tag(unique_name("k8s"))
    field = netbox.create_custom_field(unique_name("env").replace("-", "_"))
    netbox.create_prefix("10.43.0.0/28")
    await create_secret(kube, namespace, netbox)
    fields = {
        "status": "reserved",
        "role": "vip",
        "tenant": tenant.slug,
        "dnsName": "{machine}.{cluster}.example.com",
        "description": "claim {namespace}/{claim}",
        "tags": [tag.slug],
        "customFields": {field.name: "prod"},
    }
    await kube.create(NB_POOLS, netbox_pool("meta", [prefix("10.43.0.0/28")], addressFields=fields), namespace)
    machine = await kube.create(
        MACHINES,
        {
            "apiVersion": MACHINES.api_version,
            "kind": "Machine",
            "metadata": {"name": "m-0"},
            "spec": {
                "clusterName": "prod",
                "bootstrap": {"dataSecretName": "m-0-bootstrap"},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "M", "name": "m-0"},
            },
        },
        namespace,
    )  # {machine} is the Machine read, its uid the ownerReference's
    machine_owner = {
        "apiVersion": MACHINES.api_version,
        "kind": "Machine",
        "name": "m-0",
        "uid": machine["metadata"]["uid"],
    }
    body = nb_claim("meta-0", "meta", labels={"cluster.x-k8s.io/cluster-name": "prod"})
    body["metadata"]["ownerReferences"] = [machine_owner]
    await kube.create(CLUSTERS, cluster("prod"), namespace)
    async with netbox_controller():
        await kube.create(CLAIMS, body, namespace)
        address = await wait_address(kube, namespace, "meta-0")
        record = netbox.api().ipam.ip_addresses.get(int(address["metadata"]["annotations"][ANNOTATION_IP_ID]))
        assert record.status.value == "reserved"
        assert record.role.value == "vip"
        assert record.tenant.id == tenant.id
        assert record.dns_name == "m-0.prod.example.com"
        assert record.description == f"claim {namespace}/meta-0"
        assert sorted(t.slug for t in record.tags) == sorted([OWNER_TAG, tag.slug])
        assert record.custom_fields[field.name] == "prod"
        assert (
            record.custom_fields[CLAIM_UID_FIELD]
            == (await kube.get(CLAIMS, "meta-0", namespace) or {})["metadata"]["uid"]
        )
        assert record.vrf is None


async def test_manual_address_in_the_prefix_is_never_released(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("10.44.0.0/29")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("manual", [prefix("10.44.0.0/29")]), namespace)
    async with netbox_controller():
        await kube.create(CLAIMS, nb_claim("mine", "manual"), namespace)
        address = await wait_address(kube, namespace, "mine")
        ip_id = int(address["metadata"]["annotations"][ANNOTATION_IP_ID])
        # Someone takes the address over in NetBox: removes our tag and our claim UID.
        record = netbox.api().ipam.ip_addresses.get(ip_id)
        record.update({"tags": [], "custom_fields": {CLAIM_UID_FIELD: None}, "description": "taken over"})
        manual = netbox.api().ipam.ip_addresses.create(address="10.44.0.5/29", description="by hand")
        await delete_claim(kube, namespace, "mine")
        await asyncio.sleep(1)
        assert netbox.api().ipam.ip_addresses.get(ip_id) is not None, "an address without our marks was deleted"
        assert netbox.api().ipam.ip_addresses.get(manual.id) is not None


async def test_global_pool_reads_the_secret_from_its_namespace(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("10.45.0.0/29")
    await create_secret(kube, namespace, netbox, name="global-netbox")
    await lend_secrets(kube, namespace)  # a cluster-scoped pool reads only a Namespace that lends its Secrets
    name = f"global-{namespace}"
    await kube.create(GLOBAL_NB_POOLS, global_netbox_pool(name, [prefix("10.45.0.0/29")], "global-netbox", namespace))
    async with netbox_controller():
        claim_body = nb_claim("g", name)
        claim_body["spec"]["poolRef"]["kind"] = "GlobalNetboxIPPool"
        await kube.create(CLAIMS, claim_body, namespace)
        address = await wait_address(kube, namespace, "g")
        assert address["spec"]["address"] == "10.45.0.1"
        await wait_pool_reason(kube, None, name, "PoolReady", resource=GLOBAL_NB_POOLS)
        await delete_claim(kube, namespace, "g")
        await kube.delete(GLOBAL_NB_POOLS, name)

        async def pool_gone() -> bool:
            return await kube.get(GLOBAL_NB_POOLS, name) is None

        await wait_for(pool_gone, timeout=60, message=f"GlobalNetboxIPPool {name} to be deleted")
    assert owned_addresses(netbox, parent="10.45.0.0/29") == []
