"""A control-plane endpoint from an InfobloxIPPool in host-record mode, against the WAPI simulator: the Cluster
gets the address, and the host record carries the Cluster's API server name (`<cluster>-apiserver` in the pool's
zone), whatever the pool's hostnameSource; deleting the Cluster deletes the record."""

from __future__ import annotations

from typing import Any

from ipam_provider.api.capi import CLAIMS, CLUSTERS
from ipam_provider.endpoint import ANNOTATION_POOL_KIND
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.infoblox import Grid
from tests.system.endpoints.test_endpoints import endpoint_cluster, wait_condition


async def test_the_host_record_carries_the_clusters_api_server_name(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    grid.sim.state.add_zone("k8s.example.com")
    host = {"dnsZone": "k8s.example.com"}  # hostnameSource machineName: an endpoint claim has no Machine
    await grid.create_pool("vips", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    async with infoblox_controller():
        obj = endpoint_cluster("prod", "vips", annotations={ANNOTATION_POOL_KIND: "InfobloxIPPool"})
        await kube.create(CLUSTERS, obj, namespace)
        await wait_condition(kube, namespace, "prod", "AddressAllocated")
        found = await kube.get(CLUSTERS, "prod", namespace)
        assert found is not None
        claim = await kube.get(CLAIMS, "prod-control-plane-endpoint", namespace)
        assert claim is not None
        (record,) = grid.objects_of(claim["metadata"]["uid"], "record:host")
        assert record["name"] == "prod-apiserver.k8s.example.com"
        assert [e["ipv4addr"] for e in record["ipv4addrs"]] == [found["spec"]["controlPlaneEndpoint"]["host"]]

        await kube.delete(CLUSTERS, "prod", namespace)

        async def released() -> bool:
            gone = await kube.get(CLAIMS, "prod-control-plane-endpoint", namespace) is None
            return gone and not grid.sim.state.objects("record:host")

        await wait_for(released, timeout=60, message="the VIP's claim and host record to go with the Cluster")
