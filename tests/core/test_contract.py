"""The CAPI IPAM contract, step by step, against the real API server with the in-cluster backend."""

from __future__ import annotations

from ipam_provider.api.capi import FINALIZER_PROTECT_ADDRESS, FINALIZER_RELEASE_ADDRESS, LABEL_CLUSTER_NAME
from ipam_provider.controller import Controller
from ipam_provider.kube.client import KubeClient
from ipam_provider.kube.resources import ADDRESSES, CLAIMS, CLUSTERS, EVENTS
from tests.support.cluster import wait_for
from tests.support.objects import POOLS, claim, cluster, pool, ready_condition, wait_address


async def test_claim_is_fulfilled_and_released(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    created_pool = await kube.create(POOLS, pool("net", ["10.10.0.0/24"], 24, gateway="10.10.0.1"), namespace)
    await kube.create(CLUSTERS, cluster("c1"), namespace)
    await kube.create(CLAIMS, claim("m1", "net", cluster="c1", labels={LABEL_CLUSTER_NAME: "c1"}), namespace)

    address = await wait_address(kube, namespace, "m1")
    assert address["spec"]["address"] == "10.10.0.2"  # .0 is the network, .1 the gateway
    assert address["spec"]["prefix"] == 24
    assert address["spec"]["gateway"] == "10.10.0.1"
    assert address["spec"]["claimRef"] == {"name": "m1"}
    assert address["spec"]["poolRef"] == {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "net"}
    assert address["metadata"]["finalizers"] == [FINALIZER_PROTECT_ADDRESS]
    assert address["metadata"]["labels"][LABEL_CLUSTER_NAME] == "c1"
    owners = {ref["kind"]: ref for ref in address["metadata"]["ownerReferences"]}
    claim_obj = await kube.get(CLAIMS, "m1", namespace)
    assert claim_obj is not None
    assert owners["IPAddressClaim"]["uid"] == claim_obj["metadata"]["uid"]
    assert owners["IPAddressClaim"]["controller"] is True and owners["IPAddressClaim"]["blockOwnerDeletion"] is True
    assert owners["InClusterIPPool"]["uid"] == created_pool["metadata"]["uid"]
    assert owners["InClusterIPPool"]["controller"] is False and owners["InClusterIPPool"]["blockOwnerDeletion"] is True
    assert FINALIZER_RELEASE_ADDRESS in claim_obj["metadata"]["finalizers"]
    assert claim_obj["status"]["addressRef"] == {"name": "m1"}
    ready = ready_condition(claim_obj)
    assert ready is not None and ready["status"] == "True" and ready["reason"] == "AddressAllocated"
    assert "10.10.0.2/24" in ready["message"]
    events, _ = await kube.list(EVENTS, namespace)
    assert any(e["reason"] == "AddressAllocated" and e["involvedObject"]["name"] == "m1" for e in events)

    await kube.delete(CLAIMS, "m1", namespace)

    async def released() -> bool:
        return await kube.get(CLAIMS, "m1", namespace) is None and await kube.get(ADDRESSES, "m1", namespace) is None

    await wait_for(released, message="the claim and its IPAddress to be gone")
    await kube.create(CLAIMS, claim("m2", "net"), namespace)
    again = await wait_address(kube, namespace, "m2")
    assert again["spec"]["address"] == "10.10.0.2", "the released address is the lowest free one again"
