"""IPAddresses that exist without reservations — written by the Go in-cluster provider before a migration,
carried by clusterctl move (which moves no InClusterIPReservation), or restored from a backup — hold their
addresses from the first allocation on, with several controller processes at once."""

from __future__ import annotations

from typing import Any

from backends.incluster.naming import RESERVATIONS
from ipam_provider.api.capi import ADDRESSES, ANNOTATION_PAUSED, CLAIMS
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.controller import ControllerFactory
from tests.support.objects import GLOBAL_POOLS, claim, global_pool, wait_address
from tests.system.incluster.test_no_duplicates import assert_unique_and_complete


def go_provider_address(name: str, claim_uid: str, pool_name: str, address: str) -> dict[str, Any]:
    """An IPAddress as the Go provider writes it: the claim as controller owner, no reservation anywhere."""
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": "IPAddress",
        "metadata": {
            "name": name,
            "ownerReferences": [
                {
                    "apiVersion": CLAIMS.api_version,
                    "kind": CLAIMS.kind,
                    "name": name,
                    "uid": claim_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "claimRef": {"name": name},
            "poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "GlobalInClusterIPPool", "name": pool_name},
            "address": address,
            "prefix": 24,
        },
    }


async def test_migrated_ipaddresses_are_never_handed_out_again_by_two_controllers(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    pool_name = f"migrated-{namespace}"
    await kube.create(GLOBAL_POOLS, global_pool(pool_name, ["10.46.0.10-10.46.0.30"], 24))
    # Two old claims, paused so that both controllers see the new claims first; their IPAddresses hold the two
    # lowest addresses of the pool.
    old: dict[str, str] = {}
    for index, address in enumerate(("10.46.0.10", "10.46.0.11")):
        name = f"old-{index}"
        created = await kube.create(
            CLAIMS, claim(name, pool_name, kind="GlobalInClusterIPPool", annotations={ANNOTATION_PAUSED: ""}), namespace
        )
        await kube.create(
            ADDRESSES, go_provider_address(name, created["metadata"]["uid"], pool_name, address), namespace
        )
        old[name] = address
    fast = RepairSettings(interval=1.0, grace_period=2.0)  # strays from the overlap go within seconds
    async with (
        controller_factory(namespaces=[namespace], repair=fast),
        controller_factory(namespaces=[namespace], repair=fast),
    ):
        for index in range(6):
            await kube.create(CLAIMS, claim(f"new-{index}", pool_name, kind="GlobalInClusterIPPool"), namespace)
        new = {(await wait_address(kube, namespace, f"new-{i}"))["spec"]["address"] for i in range(6)}
        assert len(new) == 6
        assert not new & set(old.values()), f"a migrated address was handed out again: {new & set(old.values())}"
        for name in old:
            await kube.patch(CLAIMS, name, {"metadata": {"annotations": {ANNOTATION_PAUSED: None}}}, namespace)
        for name, address in old.items():
            adopted = await wait_address(kube, namespace, name)
            assert adopted["spec"]["address"] == address
        await assert_unique_and_complete(kube, namespace, 8)  # no duplicate, one reservation per claim
    reservations, _ = await kube.list(RESERVATIONS)
    by_address = {r["spec"]["address"]: r["spec"]["claim"] for r in reservations}
    for name, address in old.items():
        claim_obj = await kube.get(CLAIMS, name, namespace)
        assert claim_obj is not None and by_address[address]["uid"] == claim_obj["metadata"]["uid"]
