"""Two management clusters share one grid: cluster B's objects (made by a backend of identity B, for claims cluster A
has never seen) stay on the grid while cluster A's controller, with a short repair interval and grace period, runs
pass after pass against the real API server. A leak stamped with A's own identity, beside them, is released by
those same passes, so the passes do run and do release: without the identity filter, B's objects would go too
(they are exactly such leaks to A)."""

from __future__ import annotations

import uuid
from typing import Any

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.spec import EA_CLUSTER_IDENTITY
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolRef
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.infoblox import FAST, Grid

REPAIR = RepairSettings(interval=0.5, grace_period=1.0)
MORE_PASSES = 6


async def test_another_clusters_objects_survive_our_repair_passes(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    pool = await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    ref = PoolRef.from_object(pool)
    cluster_b = InfobloxBackend(BackendContext(kube=kube, cluster_identity="cluster-b"), FAST)
    try:
        b_claims = [ClaimContext(namespace, f"node-{i}", str(uuid.uuid4())) for i in range(3)]
        for claim in b_claims:
            await cluster_b.allocate(ref, pool, claim)
    finally:
        await cluster_b.close()
    b_refs = sorted(o["_ref"] for claim in b_claims for o in grid.objects_of(claim.uid))
    assert len(b_refs) == 3
    marks = {
        "CAPI-Claim-UID": str(uuid.uuid4()),
        "CAPI-Claim-Namespace": namespace,
        "CAPI-Claim-Name": "ghost",
        "CAPI-Pool": f"{namespace}/net",
        EA_CLUSTER_IDENTITY: "cluster-a",
    }
    ghost = grid.sim.state.add_fixed_address("10.10.0.77", extattrs=marks)

    async with infoblox_controller(repair=REPAIR, cluster_identity="cluster-a") as controller:

        async def ghost_released() -> int | None:
            return controller.repair.passes if grid.sim.state.get(ghost) is None else None

        released_at = await wait_for(ghost_released, timeout=60, message="cluster A's own leak to be released")

        async def more_passes() -> bool:
            return bool(controller.repair.passes >= released_at + MORE_PASSES)

        await wait_for(more_passes, timeout=60, message=f"{MORE_PASSES} more repair passes")
        left = sorted(o["_ref"] for claim in b_claims for o in grid.objects_of(claim.uid))
        assert left == b_refs, "cluster B's objects are never released by cluster A"
