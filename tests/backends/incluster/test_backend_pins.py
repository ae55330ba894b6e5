"""Pre-allocations enforced by the API server, against a real one: each free pinned address is held by a reservation
for its named claim, so a process that has not seen the pin cannot take it; the named claim takes the reservation
over, gives it back to the pin when released, and a removed pin frees its address. A claim takes back its own
released reservation; released reservations go once the pool has no grace period; a removed pin stops being parked.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from backends.incluster.allocator import collisions
from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.reservations import Reservation, ReservationClient
from backends.incluster.spec import PreAllocations, parse_pool
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    AllocationFailedError,
    BackendContext,
    ClaimContext,
    PoolRef,
)
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from tests.support.objects import POOLS, pool
from tests.system.incluster.test_existing_from_cache import allocate


def requesting(namespace: str, name: str, uid: str, address: str) -> ClaimContext:
    return ClaimContext(namespace, name, uid, annotations={REQUESTED_ADDRESS_ANNOTATION: address})


async def storage_ready(reservations: ReservationClient, ref: PoolRef) -> None:
    """Wait while the API server answers 429 for reservations (their CRD's storage may still be initialising when
    this is the session's first test), as the controller's queue would retry."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await reservations.list_pool(ref)
            return
        except ApiError as error:
            if not error.throttled or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def reservation(backend: InClusterBackend, ref: PoolRef, address: str) -> Reservation:
    found = await backend.ledger.reservations.get(ref, address)
    assert found is not None, f"{address} must be reserved"
    return found


async def test_a_pin_is_reserved_so_a_process_with_a_stale_spec_cannot_take_it(
    kube: KubeClient, namespace: str
) -> None:
    old = await kube.create(POOLS, pool("pins", ["10.73.0.10-10.73.0.13"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "pins")
    stale = InClusterBackend(BackendContext(kube=kube))  # its cache never sees the pin
    current = InClusterBackend(BackendContext(kube=kube))
    try:
        await storage_ready(current.ledger.reservations, ref)
        await stale.prepare(ref, old)
        new = await kube.patch(POOLS, "pins", {"spec": {"preAllocations": {"named": "10.73.0.10"}}}, namespace)
        assert (await current.report(ref, new, [])).ready
        pin = await reservation(current, ref, "10.73.0.10")
        assert (pin.claim, pin.claim_uid, pin.released_at) == (f"{namespace}/named", "", None)
        assert (await stale.allocate(ref, old, ClaimContext(namespace, "d", "uid-d"))).address == "10.73.0.11"
        with pytest.raises(AllocationFailedError, match=f"10.73.0.10 is already held by claim {namespace}/named in"):
            await stale.allocate(ref, old, requesting(namespace, "asks", "uid-asks", "10.73.0.10"))
        named = ClaimContext(namespace, "named", "uid-named")
        got = await allocate(current, ref, new, named)
        assert got.address == "10.73.0.10"
        assert (await reservation(current, ref, "10.73.0.10")).claim_uid == "uid-named"
        # Released while the spec names it: back to the pin, not free for the pool.
        await current.release(ref, new, named, got)
        back = await reservation(current, ref, "10.73.0.10")
        assert (back.claim, back.claim_uid, back.released_at) == (f"{namespace}/named", "", None)
        report = await current.report(ref, new, [Allocation("10.73.0.11", 24, None)])
        assert report.ready and report.counts is not None and report.counts.free == 2, report
        assert (await reservation(current, ref, "10.73.0.10")).claim_uid == ""
        # The pin removed: its reservation goes and the address is the lowest free one again.
        removed = await kube.patch(POOLS, "pins", {"spec": {"preAllocations": None}}, namespace)
        await current.report(ref, removed, [Allocation("10.73.0.11", 24, None)])
        assert await current.ledger.reservations.get(ref, "10.73.0.10") is None
        assert (await allocate(current, ref, removed, ClaimContext(namespace, "e", "uid-e"))).address == "10.73.0.10"
    finally:
        await stale.close()
        await current.close()


async def test_a_claim_takes_back_its_own_released_address_and_releases_go_when_the_grace_period_does(
    kube: KubeClient, namespace: str
) -> None:
    created = await kube.create(
        POOLS, pool("grace", ["10.74.0.10-10.74.0.20"], 24, addressReuseGracePeriodSeconds=3600), namespace
    )
    ref = IN_CLUSTER_POOL.ref(namespace, "grace")
    backend = InClusterBackend(BackendContext(kube=kube))
    try:
        first = requesting(namespace, "node", "uid-1", "10.74.0.12")
        await backend.release(ref, created, first, await allocate(backend, ref, created, first))
        assert (await reservation(backend, ref, "10.74.0.12")).released_at
        # Pinned to that claim name now; the claim re-created (another uid) takes its released reservation over.
        pinned = await kube.patch(POOLS, "grace", {"spec": {"preAllocations": {"node": "10.74.0.12"}}}, namespace)
        again = await allocate(backend, ref, pinned, ClaimContext(namespace, "node", "uid-2"))
        assert again.address == "10.74.0.12"
        live = await reservation(backend, ref, "10.74.0.12")
        assert (live.claim_uid, live.released_at) == ("uid-2", None)
        # A release waiting out the grace period is reclaimed once the pool has no grace period any more.
        other = requesting(namespace, "other", "uid-o", "10.74.0.13")
        await backend.release(ref, pinned, other, await allocate(backend, ref, pinned, other))
        no_grace = await kube.patch(POOLS, "grace", {"spec": {"addressReuseGracePeriodSeconds": None}}, namespace)
        late = requesting(namespace, "late", "uid-l", "10.74.0.13")
        assert (await allocate(backend, ref, no_grace, late)).address == "10.74.0.13"
    finally:
        await backend.close()


async def test_a_released_reservation_unknown_to_the_index_fails_the_claim_until_its_grace_period_ends(
    kube: KubeClient, namespace: str
) -> None:
    created = await kube.create(
        POOLS, pool("unknown", ["10.77.0.0/24"], 24, addressReuseGracePeriodSeconds=3600), namespace
    )
    ref = IN_CLUSTER_POOL.ref(namespace, "unknown")
    stale = InClusterBackend(BackendContext(kube=kube))
    current = InClusterBackend(BackendContext(kube=kube))
    try:
        await storage_ready(current.ledger.reservations, ref)
        await stale.prepare(ref, created)
        first = requesting(namespace, "first", "uid-f", "10.77.0.5")
        await current.release(ref, created, first, await allocate(current, ref, created, first))
        with pytest.raises(AllocationFailedError, match="released;") as failed:
            await stale.allocate(ref, created, requesting(namespace, "second", "uid-s", "10.77.0.5"))
        assert failed.value.retry_after is not None and 3500 < failed.value.retry_after <= 3601
    finally:
        await stale.close()
        await current.close()


async def test_a_removed_pin_is_no_longer_parked(kube: KubeClient, namespace: str) -> None:
    created = await kube.create(
        POOLS, pool("parked", ["10.75.0.10-10.75.0.20"], 24, preAllocations={"named": "10.75.0.10"}), namespace
    )
    ref = IN_CLUSTER_POOL.ref(namespace, "parked")
    backend = InClusterBackend(BackendContext(kube=kube))
    try:
        assert (await allocate(backend, ref, created, ClaimContext(namespace, "a", "uid-a"))).address == "10.75.0.11"
        removed = await kube.patch(POOLS, "parked", {"spec": {"preAllocations": None}}, namespace)
        assert (await allocate(backend, ref, removed, ClaimContext(namespace, "b", "uid-b"))).address == "10.75.0.10"
    finally:
        await backend.close()


class CountingReservations(ReservationClient):
    """Counts the reads `collisions` makes of the API server."""

    gets = 0
    lists = 0

    async def get(self, ref: PoolRef, address: str) -> Reservation | None:
        self.gets += 1
        return await super().get(ref, address)

    async def list_pool(self, ref: PoolRef) -> list[Reservation]:
        self.lists += 1
        return await super().list_pool(ref)


async def test_collisions_without_a_cache_read_the_pool_s_reservations_once(kube: KubeClient, namespace: str) -> None:
    entries = {"a": "10.76.0.10", "b": "10.76.0.11", "c": "10.76.0.12", "d": "10.76.0.13"}
    created = await kube.create(POOLS, pool("busy", ["10.76.0.10-10.76.0.20"], 24, preAllocations=entries), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "busy")
    counting = CountingReservations(kube)
    await storage_ready(counting, ref)
    counting.lists = 0
    for address, holder in (("10.76.0.10", "x"), ("10.76.0.11", "b"), ("10.76.0.12", "y")):
        await counting.create(ref, Allocation(address, 24, None), ClaimContext(namespace, holder, f"uid-{holder}"))
    spec, allocatable = parse_pool(created)
    pre = PreAllocations.of(ref, spec.pre_allocations, allocatable)
    used = [Allocation(address, 24, None) for address in ("10.76.0.10", "10.76.0.11", "10.76.0.12")]
    problems, waiting = await collisions(pre, used, None, counting)
    assert problems == [
        f"spec.preAllocations[a]: 10.76.0.10 is already held by claim {namespace}/x",
        f"spec.preAllocations[c]: 10.76.0.12 is already held by claim {namespace}/y",
    ]
    assert waiting == 1
    assert (counting.gets, counting.lists) == (0, 1)
