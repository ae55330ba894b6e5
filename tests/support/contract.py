"""The CAPI IPAM contract flow, step by step, against a real API server with the in-cluster backend.

One flow, two callers: tests/system/test_contract.py runs it on the session's control plane (the
pinned Cluster API release), tests/system/test_capi_releases.py on a control plane per Cluster API release of the
compatibility matrix. The steps:

1. allocate: a claim of a Cluster gets the pool's lowest free address, an IPAddress with the contract's owners,
   finalizer and label, `status.addressRef`, `Ready=True/AddressAllocated` and an Event;
2. pause: while its Cluster has `spec.paused: true`, a deleted claim keeps its address and a new claim gets
   nothing;
3. release: once unpaused, the deleted claim and its IPAddress go, and the waiting claim is served;
4. re-create: a new claim gets the released address again, and its IPAddress, deleted while the claim lives, is
   re-created with identical values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ipam_provider.api.capi import (
    ADDRESSES,
    CLAIMS,
    CLUSTERS,
    FINALIZER_PROTECT_ADDRESS,
    FINALIZER_RELEASE_ADDRESS,
    LABEL_CLUSTER_NAME,
)
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.objects import POOLS, claim, cluster, pool, ready_condition, wait_address, wait_events

Object = dict[str, Any]


async def _settled(controller: Controller, seen: Callable[[], bool], what: str) -> None:
    """Wait until the controller's caches show `seen()` and its work queue is idle: the change has been
    reconciled, so what did not happen will not happen. Informers call the event handlers (which queue the keys)
    in the same step as they update the caches, so a key cannot slip in between."""

    async def probe() -> bool:
        return seen() and len(controller.queue) == 0 and controller.queue.processing == 0

    await wait_for(probe, message=f"the controller to see {what} and finish reconciling it")


async def contract_flow(kube: KubeClient, namespace: str, controller: Controller) -> None:
    """Run the whole flow in `namespace`, which `controller` serves; fail on the first step that breaks."""
    # 1. Allocate.
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
    await wait_events(
        kube,
        namespace,
        controller.context.recorder,
        lambda e: e["reason"] == "AddressAllocated" and e["involvedObject"]["name"] == "m1",
        "an AddressAllocated Event on claim m1",
    )

    # 2. Pause: the Cluster's spec.paused holds the release of a deleted claim and the allocation of a new one. (A
    # Cluster schema without spec.paused would prune the field, and the release would go ahead.)
    await kube.create(POOLS, pool("side", ["10.10.1.0/24"], 24), namespace)
    paused = await kube.patch(CLUSTERS, "c1", {"spec": {"paused": True}}, namespace)
    assert paused["spec"].get("paused") is True, f"the Cluster CRD kept no spec.paused: {paused['spec']}"

    def sees_paused() -> bool:
        return bool((controller.caches.clusters.get(namespace, "c1") or {}).get("spec", {}).get("paused"))

    await _settled(controller, sees_paused, "the paused Cluster")
    await kube.delete(CLAIMS, "m1", namespace)
    await kube.create(CLAIMS, claim("m3", "side", cluster="c1"), namespace)

    def sees_both() -> bool:
        deleted = controller.caches.claims.get(namespace, "m1")  # None: released in spite of the pause
        deleting = deleted is None or bool(deleted["metadata"].get("deletionTimestamp"))
        return deleting and controller.caches.claims.get(namespace, "m3") is not None

    await _settled(controller, sees_both, "the deleted claim and the new claim of the paused Cluster")
    held = await kube.get(CLAIMS, "m1", namespace)
    assert held is not None and FINALIZER_RELEASE_ADDRESS in held["metadata"]["finalizers"], (
        "a paused Cluster's deleted claim keeps its finalizer"
    )
    kept = await kube.get(ADDRESSES, "m1", namespace)
    assert kept is not None and kept["metadata"]["uid"] == address["metadata"]["uid"], (
        "a paused Cluster's deleted claim keeps its IPAddress"
    )
    waiting = await kube.get(CLAIMS, "m3", namespace)
    assert waiting is not None and not waiting["metadata"].get("finalizers") and not waiting.get("status"), (
        f"a paused Cluster's new claim is left alone: {waiting}"
    )
    assert await kube.get(ADDRESSES, "m3", namespace) is None

    # 3. Release, once unpaused; the waiting claim is served from its own pool.
    await kube.patch(CLUSTERS, "c1", {"spec": {"paused": False}}, namespace)

    async def released() -> bool:
        return await kube.get(CLAIMS, "m1", namespace) is None and await kube.get(ADDRESSES, "m1", namespace) is None

    await wait_for(released, message="the claim and its IPAddress to be gone")
    served = await wait_address(kube, namespace, "m3")
    assert served["spec"]["address"] == "10.10.1.1", "the claim that waited for its Cluster is served once unpaused"

    # 4. Re-create: the released address is handed out again; a deleted IPAddress comes back as it was.
    await kube.create(CLAIMS, claim("m2", "net"), namespace)
    again = await wait_address(kube, namespace, "m2")
    assert again["spec"]["address"] == "10.10.0.2", "the released address is the lowest free one again"
    await kube.delete(ADDRESSES, "m2", namespace)

    async def recreated() -> Object | None:
        current = await kube.get(ADDRESSES, "m2", namespace)
        return current if current and current["metadata"]["uid"] != again["metadata"]["uid"] else None

    current = await wait_for(recreated, message="the IPAddress deleted under a live claim to be re-created")
    assert current["spec"] == again["spec"]
    assert current["metadata"]["finalizers"] == [FINALIZER_PROTECT_ADDRESS]
    claim_obj = await kube.get(CLAIMS, "m2", namespace)
    assert claim_obj is not None and claim_obj["status"]["addressRef"] == {"name": "m2"}
