"""Claim lifecycles against the real API server: ignored claims, late pools, pause, exhaustion, clusters,
adoption and re-creation of IPAddresses."""

from __future__ import annotations

import asyncio
from typing import Any

from backends.incluster.naming import RESERVATIONS
from ipam_provider.api.capi import (
    ADDRESSES,
    ANNOTATION_PAUSED,
    CLAIMS,
    CLUSTERS,
    FINALIZER_PROTECT_ADDRESS,
    FINALIZER_RELEASE_ADDRESS,
)
from ipam_provider.backend.contract import PoolKind
from ipam_provider.backend.protocol import Capabilities
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import (
    POOLS,
    claim,
    cluster,
    pool,
    ready_condition,
    wait_address,
    wait_claim_reason,
)


async def test_claims_of_foreign_kinds_or_groups_are_ignored(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.20.0.0/29"], 29), namespace)
    await kube.create(CLAIMS, claim("foreign-kind", "net", kind="SomeOtherIPPool"), namespace)
    await kube.create(CLAIMS, claim("foreign-group", "net", group="ipam.example.com"), namespace)
    await kube.create(CLAIMS, claim("ours", "net"), namespace)
    await wait_address(kube, namespace, "ours")
    await asyncio.sleep(1.0)
    for name in ("foreign-kind", "foreign-group"):
        obj = await kube.get(CLAIMS, name, namespace)
        assert obj is not None
        assert not obj["metadata"].get("finalizers"), f"{name} must not get our finalizer"
        assert not obj.get("status"), f"{name} must not get a status from us"
        assert await kube.get(ADDRESSES, name, namespace) is None


async def test_a_pool_that_appears_later_serves_the_waiting_claim(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(CLAIMS, claim("early", "late-pool"), namespace)
    waiting = await wait_claim_reason(kube, namespace, "early", "PoolNotReady")
    condition = ready_condition(waiting)
    assert condition is not None and "late-pool" in condition["message"] and "not found" in condition["message"]
    assert FINALIZER_RELEASE_ADDRESS in waiting["metadata"]["finalizers"]
    await kube.create(POOLS, pool("late-pool", ["10.21.0.10-10.21.0.20"], 24), namespace)
    address = await wait_address(kube, namespace, "early", timeout=15)
    assert address["spec"]["address"] == "10.21.0.10"


async def test_exhaustion_then_release_then_the_waiting_claim_is_fulfilled(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("tiny", ["10.22.0.5", "10.22.0.6"], 24), namespace)
    await kube.create(CLAIMS, claim("a", "tiny"), namespace)
    await kube.create(CLAIMS, claim("b", "tiny"), namespace)
    first = {(await wait_address(kube, namespace, n))["spec"]["address"] for n in ("a", "b")}
    assert first == {"10.22.0.5", "10.22.0.6"}
    await kube.create(CLAIMS, claim("c", "tiny"), namespace)
    exhausted = await wait_claim_reason(kube, namespace, "c", "PoolExhausted")
    condition = ready_condition(exhausted)
    assert condition is not None and condition["status"] == "False" and "no free address" in condition["message"]
    freed = (await kube.get(ADDRESSES, "a", namespace) or {})["spec"]["address"]
    await kube.delete(CLAIMS, "a", namespace)
    address = await wait_address(kube, namespace, "c", timeout=15)
    assert address["spec"]["address"] == freed


async def test_pause_blocks_allocation_and_release_on_every_path(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.23.0.0/28"], 28), namespace)
    await kube.create(CLUSTERS, cluster("paused-cluster", paused=True), namespace)
    annotated = cluster("annotated-cluster")
    annotated["metadata"]["annotations"] = {ANNOTATION_PAUSED: ""}
    await kube.create(CLUSTERS, annotated, namespace)
    await kube.create(CLAIMS, claim("by-spec", "net", cluster="paused-cluster"), namespace)
    await kube.create(CLAIMS, claim("by-annotation", "net", cluster="annotated-cluster"), namespace)
    await kube.create(CLAIMS, claim("by-claim", "net", annotations={ANNOTATION_PAUSED: ""}), namespace)
    await asyncio.sleep(1.5)
    for name in ("by-spec", "by-annotation", "by-claim"):
        obj = await kube.get(CLAIMS, name, namespace)
        assert obj is not None and not obj["metadata"].get("finalizers") and not obj.get("status"), name
    # Unpausing lets each through.
    await kube.patch(CLUSTERS, "paused-cluster", {"spec": {"paused": False}}, namespace)
    await kube.patch(CLUSTERS, "annotated-cluster", {"metadata": {"annotations": {ANNOTATION_PAUSED: None}}}, namespace)
    await kube.patch(CLAIMS, "by-claim", {"metadata": {"annotations": {ANNOTATION_PAUSED: None}}}, namespace)
    for name in ("by-spec", "by-annotation", "by-claim"):
        await wait_address(kube, namespace, name)

    # A paused pool: no release while paused, release once unpaused.
    await kube.patch(POOLS, "net", {"metadata": {"annotations": {ANNOTATION_PAUSED: ""}}}, namespace)
    await asyncio.sleep(0.5)
    await kube.delete(CLAIMS, "by-claim", namespace)
    await kube.create(CLAIMS, claim("while-pool-paused", "net"), namespace)
    await asyncio.sleep(1.5)
    held = await kube.get(CLAIMS, "by-claim", namespace)
    assert held is not None and held["metadata"].get("deletionTimestamp"), "release must wait while the pool is paused"
    assert await kube.get(ADDRESSES, "by-claim", namespace) is not None
    waiting = await kube.get(CLAIMS, "while-pool-paused", namespace)
    assert waiting is not None and not waiting.get("status"), "allocation must wait while the pool is paused"
    # A paused cluster also blocks release.
    await kube.patch(CLUSTERS, "paused-cluster", {"spec": {"paused": True}}, namespace)
    await asyncio.sleep(0.5)
    await kube.delete(CLAIMS, "by-spec", namespace)
    await kube.patch(POOLS, "net", {"metadata": {"annotations": {ANNOTATION_PAUSED: None}}}, namespace)

    async def by_claim_gone() -> bool:
        return await kube.get(CLAIMS, "by-claim", namespace) is None

    await wait_for(by_claim_gone, message="by-claim to be released once the pool is unpaused")
    await wait_address(kube, namespace, "while-pool-paused")
    await asyncio.sleep(1.0)
    assert await kube.get(CLAIMS, "by-spec", namespace) is not None, "a paused cluster blocks release"
    await kube.patch(CLUSTERS, "paused-cluster", {"spec": {"paused": False}}, namespace)

    async def by_spec_gone() -> bool:
        return await kube.get(CLAIMS, "by-spec", namespace) is None

    await wait_for(by_spec_gone, message="by-spec to be released once its cluster is unpaused")


async def test_cluster_not_found_waits_and_a_deleted_cluster_does_not_block_release(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.24.0.0/28"], 28), namespace)
    await kube.create(CLAIMS, claim("orphan", "net", cluster="not-yet"), namespace)
    waiting = await wait_claim_reason(kube, namespace, "orphan", "AllocationFailed")
    condition = ready_condition(waiting)
    assert condition is not None and "Cluster" in condition["message"] and "not-yet" in condition["message"]
    assert await kube.get(ADDRESSES, "orphan", namespace) is None
    await kube.create(CLUSTERS, cluster("not-yet"), namespace)
    await wait_address(kube, namespace, "orphan")

    await kube.delete(CLUSTERS, "not-yet", namespace)

    async def cluster_gone() -> bool:
        return await kube.get(CLUSTERS, "not-yet", namespace) is None

    await wait_for(cluster_gone, message="the cluster to be deleted")
    await kube.delete(CLAIMS, "orphan", namespace)

    async def released() -> bool:
        return (
            await kube.get(CLAIMS, "orphan", namespace) is None
            and await kube.get(ADDRESSES, "orphan", namespace) is None
        )

    await wait_for(released, message="the claim of a deleted cluster to be released")


async def test_a_pre_existing_ipaddress_is_adopted_with_its_spec_untouched(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    """An IPAddress without reservation (restored, moved, or written by the Go provider) at the pool's lowest
    free address: a new claim reconciled before the IPAddress's own claim even exists must not get it."""
    await kube.create(POOLS, pool("net", ["10.25.0.0/24"], 24, gateway="10.25.0.1"), namespace)
    pre_existing = {
        "apiVersion": ADDRESSES.api_version,
        "kind": "IPAddress",
        "metadata": {"name": "adopted"},
        "spec": {
            "claimRef": {"name": "adopted"},
            "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "net"},
            "address": "10.25.0.2",  # .0 is the network, .1 the gateway: .2 is the lowest free address
            "prefix": 24,
            "gateway": "10.25.0.1",
        },
    }
    await kube.create(ADDRESSES, pre_existing, namespace)
    await kube.create(CLAIMS, claim("newcomer", "net"), namespace)
    newcomer = await wait_address(kube, namespace, "newcomer")
    assert newcomer["spec"]["address"] == "10.25.0.3", "the pre-existing IPAddress's address must be skipped"
    await kube.create(CLAIMS, claim("adopted", "net"), namespace)
    adopted = await wait_address(kube, namespace, "adopted")
    assert adopted["spec"] == pre_existing["spec"]
    assert FINALIZER_PROTECT_ADDRESS in adopted["metadata"]["finalizers"]
    assert {ref["kind"] for ref in adopted["metadata"]["ownerReferences"]} == {"IPAddressClaim", "InClusterIPPool"}
    # The adopted address is held for the claim: filling the pool never hands it out again.
    for index in range(3):
        await kube.create(CLAIMS, claim(f"fill-{index}", "net"), namespace)
    filled = [(await wait_address(kube, namespace, f"fill-{i}"))["spec"]["address"] for i in range(3)]
    assert "10.25.0.2" not in filled
    reservations, _ = await kube.list(RESERVATIONS)
    held = {
        r["spec"]["address"]: r["spec"]["claim"] for r in reservations if r["spec"]["claim"]["namespace"] == namespace
    }
    adopted_claim = await kube.get(CLAIMS, "adopted", namespace)
    assert adopted_claim is not None
    assert held["10.25.0.2"]["uid"] == adopted_claim["metadata"]["uid"], "the claim took its reservation over"
    assert len(held) == 5


async def test_a_deleted_ipaddress_is_recreated_with_identical_values(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.26.0.0/24"], 24, gateway="10.26.0.1"), namespace)
    await kube.create(CLAIMS, claim("keeper", "net"), namespace)
    original = await wait_address(kube, namespace, "keeper")
    await kube.delete(ADDRESSES, "keeper", namespace)

    async def recreated() -> dict[str, Any] | None:
        current = await kube.get(ADDRESSES, "keeper", namespace)
        if current and current["metadata"]["uid"] != original["metadata"]["uid"]:
            return current
        return None

    current = await wait_for(recreated, message="the IPAddress to be re-created")
    assert current["spec"] == original["spec"]
    assert FINALIZER_PROTECT_ADDRESS in current["metadata"]["finalizers"]
    claim_obj = await kube.get(CLAIMS, "keeper", namespace)
    assert claim_obj is not None and claim_obj["status"]["addressRef"] == {"name": "keeper"}


async def test_a_registered_pool_kind_without_its_crd_does_not_stop_the_controller(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    """Users install only the CRDs of the backends they use; the others must not block the rest."""
    missing = PoolKind("ipam.example.org", "v1", "UninstalledIPPool", "uninstalledippools", namespaced=True)

    class UninstalledBackend:
        kinds = (missing,)

        async def allocate(self, pool: Any, claim: Any, existing: Any = None) -> Any:
            raise AssertionError("never called: no pool of this kind can exist")

        async def release(self, *args: Any) -> None:
            return None

        async def report(self, pool: Any, addresses: Any) -> Any:
            raise AssertionError("never called")

        async def close(self) -> None:
            return None

        def capabilities(self) -> Capabilities:
            return Capabilities()

    await kube.create(POOLS, pool("net", ["10.27.0.0/29"], 29), namespace)
    await kube.create(CLAIMS, claim("served", "net"), namespace)
    async with controller_factory(namespaces=[namespace], extra_backends=[lambda _: UninstalledBackend()]):
        await wait_address(kube, namespace, "served")
