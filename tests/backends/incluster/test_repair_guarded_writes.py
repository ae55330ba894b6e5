"""The in-cluster repair capability against the real API server, where a write finds the reservation changed or
held by another pool's release record: a release whose guarded delete found the reservation changed leaves it in
the pool's index, the sweep of deleted pools counts only what it deleted, and a restore never reports another
pool's release record as a duplicate."""

from __future__ import annotations

import pytest

from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.repair import sweep_orphans
from backends.incluster.reservations import Reservation, ReservationClient
from backends.incluster.spec import ReleaseTerms
from ipam_provider.api.capi import IPAM_GROUP
from ipam_provider.backend.contract import Allocation, AllocationFailedError, BackendContext, ClaimContext, PoolRef
from ipam_provider.backend.repair import RestoreOutcome
from ipam_provider.runtime.kube.client import KubeClient
from tests.backends.incluster.test_repair import repairer, stored
from tests.support.objects import GLOBAL_POOLS, POOLS, global_pool, pool
from tests.system.incluster.test_existing_from_cache import allocate


@pytest.fixture
async def backend(kube: KubeClient) -> InClusterBackend:
    return InClusterBackend(BackendContext(kube=kube))


async def test_a_release_whose_delete_found_the_reservation_changed_keeps_it_in_the_index(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    obj = await kube.create(POOLS, pool("guarded", ["10.121.1.10-10.121.1.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "guarded")
    got = await allocate(backend, ref, obj, ClaimContext(namespace, "c", "uid-c"))
    listed = await stored(kube, ref, got.address)
    assert listed is not None
    await backend.ledger.reservations.reassign(listed, "uid-someone-else")  # changed after it was read

    released = await backend.ledger.release(ref, ReleaseTerms.of(ref, obj), listed)

    assert not released
    assert await stored(kube, ref, got.address) is not None
    index = backend.ledger.get(ref)
    assert index is not None and index.value_of(got.address) in index.by_address, "still held in the index"


class ChangedBeforeDelete(ReservationClient):
    """Reservations that another writer changes just before each delete (a real write to the API server)."""

    async def delete(self, reservation: Reservation) -> bool:
        await self.reassign(reservation, "uid-changed-meanwhile")
        return await super().delete(reservation)


async def test_the_sweep_of_deleted_pools_counts_only_what_it_deleted(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    gone = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "gone-but-changing")
    await backend.ledger.reservations.create(
        gone, Allocation("10.121.2.5", 24, None), ClaimContext(namespace, "ghost", "uid-ghost")
    )
    changing = ChangedBeforeDelete(kube)

    assert await sweep_orphans(changing, [IN_CLUSTER_POOL], 0.0) == 0
    assert await stored(kube, gone, "10.121.2.5") is not None


async def test_another_pools_release_record_is_no_duplicate_and_is_restored_over_once_expired(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    domain = f"records-{namespace}"
    addresses = ["10.121.3.10-10.121.3.20"]
    a_obj = await kube.create(POOLS, pool("a", addresses, 24, uniquenessDomain=domain), namespace)
    b_obj = await kube.create(
        GLOBAL_POOLS,
        global_pool(f"b-{namespace}", addresses, 24, uniquenessDomain=domain, addressReuseGracePeriodSeconds=3600),
    )
    a, b = IN_CLUSTER_POOL.ref(namespace, "a"), GLOBAL_IN_CLUSTER_POOL.ref(None, f"b-{namespace}")
    on_b = ClaimContext(namespace, "on-b", "uid-b")
    got = await allocate(backend, b, b_obj, on_b)
    await backend.release(b, b_obj, on_b, got)
    claim = ClaimContext(namespace, "moved", "uid-moved")  # its IPAddress names pool a at b's released address

    with pytest.raises(AllocationFailedError, match=rf"reuse grace period of pool {b} until \d{{4}}-"):
        await repairer(backend).restore(a, a_obj, claim, got)
    record = await stored(kube, b, got.address, domain)
    assert record is not None and record.released_at, "b's record is left alone during its grace period"

    await backend.ledger.reservations.mark_released(record, "2020-01-01T00:00:00Z", 3600)  # its period is over
    answer = await repairer(backend).restore(a, a_obj, claim, got)
    assert answer.outcome is RestoreOutcome.RECORDED, answer
    held = await stored(kube, a, got.address, domain)
    assert held is not None and (held.pool, held.claim_uid) == (a, "uid-moved")
