"""A control-plane endpoint from a NetboxIPPool against the real NetBox: the Cluster gets an address NetBox
allocated, recorded with the role `vip`; deleting the Cluster deletes the NetBox record."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ipam_provider.api.capi import CLAIMS, CLUSTERS
from ipam_provider.endpoint import ANNOTATION_POOL_KIND
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.netbox_backend import NB_POOLS, create_secret, netbox_pool, owned_addresses, prefix, record_gateway
from tests.system.endpoints.test_endpoints import endpoint_cluster, wait_condition

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer


async def test_a_cluster_gets_a_vip_recorded_in_netbox(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Any
) -> None:
    netbox.create_prefix("10.41.0.0/29")
    record_gateway(netbox, "10.41.0.1/29")
    await create_secret(kube, namespace, netbox)
    await kube.create(NB_POOLS, netbox_pool("vips", [prefix("10.41.0.0/29", gateway="10.41.0.1")]), namespace)
    async with netbox_controller():
        cluster = endpoint_cluster("nb", "vips", annotations={ANNOTATION_POOL_KIND: "NetboxIPPool"})
        await kube.create(CLUSTERS, cluster, namespace)
        condition = await wait_condition(kube, namespace, "nb", "AddressAllocated")
        found = await kube.get(CLUSTERS, "nb", namespace)
        assert found is not None and found["spec"]["controlPlaneEndpoint"] == {"host": "10.41.0.2", "port": 6443}
        assert condition["message"].startswith(f"10.41.0.2 from NetboxIPPool/{namespace}/vips")
        [record] = owned_addresses(netbox, parent="10.41.0.0/29")
        assert record.address == "10.41.0.2/29" and record.role.value == "vip"

        await kube.delete(CLUSTERS, "nb", namespace)

        async def released() -> bool:
            claim = await kube.get(CLAIMS, "nb-control-plane-endpoint", namespace)
            return claim is None and not owned_addresses(netbox, parent="10.41.0.0/29")

        await wait_for(released, timeout=60, message="the VIP's claim and NetBox record to go with the Cluster")
