"""examples/netbox/ is accepted by the real CRDs and served by the controller against the real NetBox, once NetBox
holds what the examples name (VRF, prefixes, range, tenant, tag, custom field, and the gateways inside the
prefixes, recorded as the examples' comments ask) and the Secret names this NetBox. No claim gets a gateway."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ipam_provider.api.capi import ADDRESSES, CLAIMS, CLUSTERS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import NAMESPACES, SECRETS
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.netbox_backend import (
    GLOBAL_NB_POOLS,
    NB_POOLS,
    backend_factory,
    get_or_create_field,
    get_or_create_tag,
    record_gateway,
    wait_pool_reason,
)
from tests.support.objects import wait_address

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "netbox"
RESOURCES = {r.kind: r for r in (NAMESPACES, SECRETS, NB_POOLS, GLOBAL_NB_POOLS, CLUSTERS, CLAIMS)}
Object = dict[str, Any]


def documents() -> list[Object]:
    return [d for path in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


async def test_examples_are_served(
    kube: KubeClient, netbox: NetBoxServer, controller_factory: ControllerFactory
) -> None:
    api = netbox.api()
    vrf = api.ipam.vrfs.get(name="production") or api.ipam.vrfs.create(name="production")
    netbox.create_prefix("10.30.0.0/24", vrf=vrf.id)
    netbox.create_ip_range("10.31.0.100/24", "10.31.0.199/24", vrf=vrf.id)
    v6 = netbox.create_prefix("2001:db8:30::/64")
    # The gateways inside the prefixes are recorded in NetBox, as the examples say (10.31.0.1 is outside its range).
    record_gateway(netbox, "10.30.0.1/24", vrf)
    record_gateway(netbox, "2001:db8:30::1/64")
    if api.tenancy.tenants.get(slug="acme") is None:
        netbox.create_tenant("Acme", slug="acme")
    get_or_create_tag(netbox, "kubernetes")
    get_or_create_field(netbox, "environment")
    docs = documents()
    kinds = [d["kind"] for d in docs]
    assert kinds.count("IPAddressClaim") == 2 and {"Secret", "NetboxIPPool", "GlobalNetboxIPPool"} <= set(kinds)
    namespace = next(d for d in docs if d["kind"] == "Namespace")["metadata"]["name"]
    for doc in docs:
        if doc["kind"] == "Secret":
            doc["stringData"].update(url=netbox.url, token=netbox.token)
        if doc["kind"] == "GlobalNetboxIPPool":
            doc["spec"]["sources"][0]["prefix"]["id"] = v6.id
        resource = RESOURCES[doc["kind"]]
        await kube.create(resource, doc, doc["metadata"].get("namespace") if resource.namespaced else None)
    global_name = next(d for d in docs if d["kind"] == "GlobalNetboxIPPool")["metadata"]["name"]
    try:
        async with controller_factory(
            namespaces=[namespace], extra_backends=[backend_factory()], include_in_cluster=False
        ) as _:
            v4 = await wait_address(kube, namespace, "demo-md-0-node-a-eth0", timeout=60)
            assert (v4["spec"]["address"], v4["spec"]["prefix"], v4["spec"]["gateway"]) == (
                "10.30.0.2",
                24,
                "10.30.0.1",
            )
            six = await wait_address(kube, namespace, "demo-md-0-node-a-eth0-v6", timeout=60)
            assert six["spec"]["address"] == "2001:db8:30::2" and six["spec"]["gateway"] == "2001:db8:30::1"
            record = api.ipam.ip_addresses.get(int(v4["metadata"]["annotations"]["netbox.ipam.cluster.x-k8s.io/ip-id"]))
            assert record.vrf.id == vrf.id and record.tenant.slug == "acme"
            assert record.dns_name == "demo-md-0-node-a-eth0.demo.k8s.example.com"
            assert record.custom_fields["environment"] == "production"
            await wait_pool_reason(kube, namespace, "demo-v4", "PoolReady")
            await wait_pool_reason(kube, None, global_name, "PoolReady", resource=GLOBAL_NB_POOLS)
            for doc in docs:
                if doc["kind"] == "IPAddressClaim":
                    await kube.delete(CLAIMS, doc["metadata"]["name"], namespace)
            await kube.delete(GLOBAL_NB_POOLS, global_name)

            async def cleaned() -> bool:
                left = (await kube.list(ADDRESSES, namespace))[0] + (await kube.list(CLAIMS, namespace))[0]
                return not left and await kube.get(GLOBAL_NB_POOLS, global_name) is None

            await wait_for(cleaned, timeout=60, message="the example claims released and the global pool deleted")
            for parent in ("10.30.0.0/24", "10.31.0.0/24", "2001:db8:30::/64"):
                assert list(api.ipam.ip_addresses.filter(tag="capi-ipam", parent=parent)) == []
    finally:
        await kube.delete(NAMESPACES, namespace)
