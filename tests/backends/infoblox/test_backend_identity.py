"""Several management clusters sharing one grid: the Infoblox backend stamps CAPI-Cluster-Identity (when the grid
defines it) on what it makes, its repair listing leaves out what another cluster made, and lists what carries no
identity (made before identities were stamped) as never releasable. Through the real infoblox-client against the
WAPI simulator, with and without the attribute's definition."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest_asyncio

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.ledger import CONDITION
from backends.infoblox.spec import EA_CLUSTER_IDENTITY, OWNERSHIP_EAS
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolRef
from ipam_provider.backend.repair import Holding, RestoreOutcome
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.infoblox import FAST, Grid

Object = dict[str, Any]
Backends = Callable[[str], InfobloxBackend]


class NoWait:
    async def wait(self) -> None:
        return None


@pytest_asyncio.fixture
async def cluster(kube: KubeClient) -> AsyncIterator[Backends]:
    """cluster(identity) -> an InfobloxBackend of the management cluster `identity`; closed at teardown."""
    made: list[InfobloxBackend] = []

    def make(identity: str) -> InfobloxBackend:
        backend = InfobloxBackend(BackendContext(kube=kube, cluster_identity=identity), FAST)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.close()


def claim_of(namespace: str, name: str) -> ClaimContext:
    return ClaimContext(namespace=namespace, name=name, uid=str(uuid.uuid4()))


async def pool_of(grid: Grid) -> tuple[PoolRef, Object]:
    pool = await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24", "gateway": "10.10.0.1"}])
    return PoolRef.from_object(pool), pool


def identity_of(grid: Grid, claim_uid: str) -> str | None:
    (obj,) = grid.objects_of(claim_uid)
    value = grid.sim.state.extattrs(obj["_ref"]).get(EA_CLUSTER_IDENTITY)
    return None if value is None else str(value)


async def listed(backend: InfobloxBackend, ref: PoolRef, pool: Object) -> dict[str, Holding]:
    return {h.claim_uid: h for h in await backend.list_holdings(ref, pool, NoWait())}


async def test_each_cluster_lists_only_its_own_and_the_unstamped_are_never_released(
    cluster: Backends, namespace: str, grid: Grid
) -> None:
    ours, theirs = cluster("cluster-a"), cluster("cluster-b")
    ref, pool = await pool_of(grid)
    # The same namespace, pool name and claim name in both clusters: only the identity tells them apart.
    mine, other = claim_of(namespace, "m1"), claim_of(namespace, "m1")
    await ours.allocate(ref, pool, mine)
    await theirs.allocate(ref, pool, other)
    assert identity_of(grid, mine.uid) == "cluster-a" and identity_of(grid, other.uid) == "cluster-b"
    old_uid = str(uuid.uuid4())  # an object made before identities were stamped
    marks = {"CAPI-Claim-UID": old_uid, "CAPI-Claim-Namespace": namespace, "CAPI-Claim-Name": "old"}
    old_ref = grid.sim.state.add_fixed_address("10.10.0.80", extattrs={**marks, "CAPI-Pool": f"{namespace}/net"})

    seen = await listed(ours, ref, pool)
    assert set(seen) == {mine.uid, old_uid}, "cluster B's object is not listed by cluster A"
    assert seen[mine.uid].releasable and not seen[old_uid].releasable
    assert EA_CLUSTER_IDENTITY in seen[old_uid].why_kept
    assert set(await listed(theirs, ref, pool)) == {other.uid, old_uid}

    assert await ours.release_holding(ref, pool, seen[old_uid]) is False, "an unstamped object is never released"
    assert grid.sim.state.get(old_ref) is not None
    # Even a holding forged to look releasable is not deleted when the object carries another identity.
    (b_obj,) = grid.objects_of(other.uid)
    forged = Holding(seen[mine.uid].address, f"{namespace}/m1", other.uid, b_obj["_ref"])
    forged = dataclasses.replace(forged, address=b_obj["ipv4addr"])
    assert await ours.release_holding(ref, pool, forged) is False
    assert len(grid.objects_of(other.uid)) == 1


async def test_a_re_keyed_claim_gets_our_identity(cluster: Backends, namespace: str, grid: Grid) -> None:
    before, after = cluster("cluster-old"), cluster("cluster-new")
    ref, pool = await pool_of(grid)
    moved = claim_of(namespace, "moved")
    allocation = await before.allocate(ref, pool, moved)
    assert identity_of(grid, moved.uid) == "cluster-old"
    # `clusterctl move` to the new management cluster: the claim has a new uid, the object is adopted there.
    await after.report(ref, pool, [allocation])  # the new cluster's grid check (as its pool reconcile does)
    renewed = dataclasses.replace(moved, uid=str(uuid.uuid4()))
    restored = await after.restore(ref, pool, renewed, allocation)
    assert restored.outcome is RestoreOutcome.RECORDED and "re-keyed" in restored.detail
    assert identity_of(grid, renewed.uid) == "cluster-new"
    assert set(await listed(after, ref, pool)) == {renewed.uid}
    assert await listed(before, ref, pool) == {}, "the old cluster no longer sees it as its own"


async def test_the_pool_says_new_objects_carry_the_identity(cluster: Backends, grid: Grid) -> None:
    backend = cluster("cluster-a")
    ref, pool = await pool_of(grid)
    report = await backend.report(ref, pool, [])
    assert report.ready
    (condition,) = [c for c in report.conditions if c.type == CONDITION]
    assert condition.status and condition.reason == "Stamped" and "cluster-a" in condition.message


async def test_without_the_definition_the_pool_works_and_says_leaks_are_only_reported(
    cluster: Backends, namespace: str, grid_factory: Callable[..., Any]
) -> None:
    grid: Grid = await grid_factory(manageExtensibleAttributeDefinitions=False)
    grid.sim.state.add_network("10.10.0.0/24")
    for name in OWNERSHIP_EAS:  # the grid admin defined the required attributes only
        grid.sim.state.add_ea_definition(name)
    backend = cluster("cluster-a")
    ref, pool = await pool_of(grid)
    claim = claim_of(namespace, "m1")
    await backend.allocate(ref, pool, claim)
    assert identity_of(grid, claim.uid) is None, "an undefined attribute is not written"

    report = await backend.report(ref, pool, [])
    assert report.ready, report.message
    (condition,) = [c for c in report.conditions if c.type == CONDITION]
    assert not condition.status and condition.reason == "ExtensibleAttributeMissing"
    assert EA_CLUSTER_IDENTITY in condition.message and "only reports" in condition.message

    (holding,) = (await listed(backend, ref, pool)).values()
    assert not holding.releasable
    assert await backend.release_holding(ref, pool, holding) is False
    assert len(grid.objects_of(claim.uid)) == 1
