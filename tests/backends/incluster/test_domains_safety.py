"""Uniqueness domains and per-pool state of the in-cluster backend, with the real backend over the in-memory API
server: a claim never takes over another domain pool's reservation, a domain pool's first allocation reserves the
IPAddresses of every pool of the domain, free counts, the reuse grace period of deleted pools' releases, the
AddressesOverlap condition of an invalid pool, domain names, and pools re-created under the same name."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.domains import ADDRESSES_OVERLAP, DOMAIN_PATTERN, NO_OVERLAP
from backends.incluster.index import PoolIndex
from backends.incluster.naming import RESERVATIONS, pool_hash
from backends.incluster.repair import sweep_orphans
from backends.incluster.reservations import Reservation, ReservationClient
from backends.incluster.spec import parse_pool
from ipam_provider.api.capi import ADDRESSES, IPAM_GROUP
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    AllocationFailedError,
    BackendContext,
    ClaimContext,
    PoolKind,
    PoolNotReadyError,
    PoolRef,
)
from ipam_provider.common import Object
from ipam_provider.reconcile.context import pool_resource
from tests.support.fake_kube import FakeKube

A = IN_CLUSTER_POOL.ref("ns", "a")
B = IN_CLUSTER_POOL.ref("ns", "b")
REPO = Path(__file__).resolve().parents[3]


def pool(name: str, domain: str | None = "d", uid: str | None = None, generation: int = 1, **spec: Any) -> Object:
    body: Object = {"addresses": ["10.0.0.0/29"], "prefix": 24, **spec}
    if domain is not None:
        body["uniquenessDomain"] = domain
    meta = {"name": name, "namespace": "ns", "generation": generation, "uid": uid or f"uid-{name}"}
    return {"apiVersion": f"{IPAM_GROUP}/v1alpha2", "kind": "InClusterIPPool", "metadata": meta, "spec": body}


def ip_address(name: str, pool_name: str, address: str) -> Object:
    """An IPAddress naming the pool, as one carried by `clusterctl move` or a restore (no reservation)."""
    return {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "address": address,
            "prefix": 24,
            "claimRef": {"name": name},
            "poolRef": {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": pool_name},
        },
    }


def backend_of(
    kube: FakeKube,
    addresses: dict[PoolRef, list[Object]] | None = None,
    pools: list[Object] | None = None,
) -> InClusterBackend:
    """The backend with the controller's caches: the given IPAddresses per pool (others: none), and the given
    namespaced pools (None: the pool caches have not synced), which its pool watch has shown it."""

    def cached_pools(kind: PoolKind) -> Sequence[Object] | None:
        if pools is None:
            return None
        return pools if kind == IN_CLUSTER_POOL else []

    cached = addresses or {}
    backend = InClusterBackend(
        BackendContext(kube=kube, cached_addresses=lambda ref: cached.get(ref, []), cached_pools=cached_pools)
    )
    for obj in pools or ():
        backend.observe_pool(IN_CLUSTER_POOL, None, obj)
    return backend


def stored_reservations(kube: FakeKube) -> list[Reservation]:
    return [Reservation.parse(item) for item in kube.stored_all(RESERVATIONS)]


async def test_a_claim_never_takes_over_a_reservation_of_another_pool_of_its_domain() -> None:
    kube = FakeKube()
    backend = backend_of(kube)
    held = await backend.allocate(B, pool("b"), ClaimContext("ns", "c", "U1"))
    # ns/c is re-created (another uid) as a claim of pool a, with an IPAddress naming a and b's address.
    with pytest.raises(AllocationFailedError) as failed:
        await backend.allocate(A, pool("a"), ClaimContext("ns", "c", "U2"), existing=Allocation(held.address, 24, None))
    assert "claim ns/c of InClusterIPPool/ns/b" in failed.value.message, failed.value.message
    [reservation] = stored_reservations(kube)
    assert (reservation.claim_uid, reservation.pool_label, reservation.address) == ("U1", pool_hash(B), held.address)
    await backend.release(A, pool("a"), ClaimContext("ns", "c", "U2"), None)
    assert [r.claim_uid for r in stored_reservations(kube)] == ["U1"], "a's release leaves b's reservation alone"


async def test_a_requested_address_never_takes_over_a_reservation_of_another_pool_of_its_domain() -> None:
    kube = FakeKube()
    backend = backend_of(kube)
    held = await backend.allocate(B, pool("b"), ClaimContext("ns", "c", "U1"))
    asking = {REQUESTED_ADDRESS_ANNOTATION: held.address}
    # ns/c is re-created (another uid) as a claim of pool a, asking for b's address by the annotation.
    with pytest.raises(AllocationFailedError) as failed:
        await backend.allocate(A, pool("a"), ClaimContext("ns", "c", "U2", annotations=asking))
    assert f"{held.address} is already held by claim ns/c of InClusterIPPool/ns/b" in failed.value.message
    # Even under the same uid, b's reservation is not a's claim's.
    with pytest.raises(AllocationFailedError):
        await backend.allocate(A, pool("a"), ClaimContext("ns", "c", "U1", annotations=asking))
    [reservation] = stored_reservations(kube)
    assert (reservation.claim_uid, reservation.pool_label) == ("U1", pool_hash(B))


async def test_a_domain_pool_knows_only_its_own_reservations_as_its_claims() -> None:
    kube = FakeKube()
    backend = backend_of(kube)
    held = await backend.allocate(B, pool("b"), ClaimContext("ns", "c", "U1"))
    got = await backend.allocate(A, pool("a"), ClaimContext("ns", "c", "U1"))
    assert got.address != held.address, "b's reservation is not a's claim's, whatever uid it names"
    assert [r.address for r in await backend.ledger.reservations.list_claim(A, "U1")] == [got.address]
    index = backend.ledger.get(A)
    assert index is not None and index.by_claim["U1"].pool_label == pool_hash(A)


def test_the_index_keeps_other_pools_reservations_out_of_its_claims() -> None:
    parsed = parse_pool(pool("a"))[1]
    index = PoolIndex.build(parsed, [], own_label=pool_hash(A))
    mine = Reservation("d.10.0.0.1", "10.0.0.1", 24, None, "U", "ns/c", None, "1", "r1", "", pool_hash(A))
    theirs = Reservation("d.10.0.0.2", "10.0.0.2", 24, None, "U", "ns/c", None, "1", "r2", "", pool_hash(B))
    index.hold(mine)
    index.hold(theirs)
    assert index.by_claim == {"U": mine} and not index.doubly_held
    assert set(index.by_address) == {parsed.addresses.first(), (parsed.addresses.first() or 0) + 1}


@pytest.mark.parametrize("pools_cached", [True, False], ids=["pool-cache", "pool-list"])
async def test_a_domain_pools_first_allocation_reserves_the_ipaddresses_of_the_whole_domain(
    pools_cached: bool,
) -> None:
    kube = FakeKube()
    b_address = ip_address("old", "b", "10.0.0.1")
    kube.put(ADDRESSES, b_address)  # b's IPAddress without a reservation (moved, migrated or restored)
    pools = [pool("a"), pool("b"), pool("other", domain="e")]
    for item in pools:
        kube.put(pool_resource(IN_CLUSTER_POOL), item)
    backend = backend_of(kube, {B: [b_address]}, pools if pools_cached else None)
    got = await backend.allocate(A, pool("a"), ClaimContext("ns", "new", "U9"))
    assert got.address == "10.0.0.2", "10.0.0.1 is b's"
    reservations = {r.address: r for r in stored_reservations(kube)}
    assert reservations["10.0.0.1"].pool_label == pool_hash(B) and reservations["10.0.0.1"].claim == "ns/old"


async def test_a_pinned_address_held_by_another_pool_of_the_domain_is_not_free_once() -> None:
    kube = FakeKube()
    pools = [pool("a", preAllocations={"vip": "10.0.0.1"}), pool("b")]
    b_address = ip_address("old", "b", "10.0.0.1")
    backend = backend_of(kube, {B: [b_address]}, pools)
    report = await backend.report(A, pools[0], [])
    assert report.counts is not None
    total = report.counts.total
    assert (total, report.counts.free) == (7, 6), "10.0.0.1 is pinned and held by b: one address, not two"


async def test_the_orphan_sweep_keeps_releases_until_their_recorded_grace_period_passed() -> None:
    kube = FakeKube()
    reservations = ReservationClient(kube)
    reservations.note_domain(B, "d")  # pool b of domain d is gone; pool a of d would reuse its addresses
    released_at = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=100)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kept = await reservations.create(B, Allocation("10.0.0.1", 24, None), ClaimContext("ns", "c1", "U1"))
    over = await reservations.create(B, Allocation("10.0.0.2", 24, None), ClaimContext("ns", "c2", "U2"))
    live = await reservations.create(B, Allocation("10.0.0.3", 24, None), ClaimContext("ns", "c3", "U3"))
    assert kept is not None and over is not None and live is not None
    await reservations.mark_released(kept, released_at, 3600)
    await reservations.mark_released(over, released_at, 30)
    deleted = await sweep_orphans(reservations, [IN_CLUSTER_POOL, GLOBAL_IN_CLUSTER_POOL], 0.0)
    assert deleted == 2
    assert [r.address for r in stored_reservations(kube)] == ["10.0.0.1"], "its grace period of an hour is not over"


async def test_the_orphan_sweep_trusts_the_pool_caches_for_pools_that_exist_and_reads_the_others() -> None:
    kube = FakeKube()
    backend = backend_of(kube, pools=[pool("a", domain=None)])  # a is cached (the API server read is skipped)
    kube.put(pool_resource(IN_CLUSTER_POOL), pool("b", domain=None))  # b is not cached, but exists
    for ref, address in ((A, "10.0.0.1"), (B, "10.0.0.2"), (IN_CLUSTER_POOL.ref("ns", "gone"), "10.0.0.3")):
        assert await backend.ledger.reservations.create(
            ref, Allocation(address, 24, None), ClaimContext("ns", f"c-{address}", f"U-{address}")
        )
    assert await backend.repair.sweep_orphaned(0.0) == 1
    assert sorted(r.address for r in stored_reservations(kube)) == ["10.0.0.1", "10.0.0.2"]


async def test_an_invalid_pool_reports_that_it_overlaps_nothing() -> None:
    kube = FakeKube()
    invalid = pool("a", addresses=["10.0.0.0/29", "10.9.0.1"])  # two subnets
    backend = backend_of(kube, pools=[invalid, pool("b")])
    report = await backend.report(A, invalid, [])
    assert report.reason == "InvalidConfiguration"
    [condition] = report.conditions
    assert (condition.type, condition.status, condition.reason) == (ADDRESSES_OVERLAP, False, NO_OVERLAP)


@pytest.mark.parametrize("domain", ["", "Upper", "a,b", "x=y", "-a", "a-", "a" * 64, "dots.are.not.labels"])
async def test_a_uniqueness_domain_that_is_not_a_dns_label_makes_the_pool_invalid(domain: str) -> None:
    backend = backend_of(FakeKube())
    report = await backend.report(A, pool("a", domain=domain), [])
    assert (report.ready, report.reason) == (False, "InvalidConfiguration")
    assert "uniquenessDomain" in report.message, report.message
    with pytest.raises(PoolNotReadyError):
        await backend.allocate(A, pool("a", domain=domain), ClaimContext("ns", "c", "U1"))
    assert backend.ledger.reservations.domain_of(A) is None


def test_the_controller_checks_the_crds_pattern_for_domains() -> None:
    for name in ("inclusterippools", "globalinclusterippools"):
        crd = yaml.safe_load((REPO / "crds" / f"ipam.cluster.x-k8s.io_{name}.yaml").read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert schema["uniquenessDomain"]["pattern"] == DOMAIN_PATTERN
        assert parse_pool(pool("a", domain="a" * 63 + ""))[0].uniqueness_domain == "a" * 63


async def test_a_pool_recreated_under_the_same_name_gets_a_new_index() -> None:
    kube = FakeKube()
    backend = backend_of(kube)
    first = pool("a", domain=None, uid="u1", generation=3)
    await backend.allocate(A, first, ClaimContext("ns", "c1", "U1"))
    await backend.release(A, first, ClaimContext("ns", "c1", "U1"), None)
    again = pool("a", domain=None, uid="u2", generation=1, addresses=["10.9.0.0/29"])
    got = await backend.allocate(A, again, ClaimContext("ns", "c2", "U2"))
    assert got.address == "10.9.0.1"


async def test_a_prepared_index_of_an_older_pool_object_is_rebuilt() -> None:
    kube = FakeKube()
    backend = backend_of(kube)
    await backend.prepare(A, pool("a", domain=None, uid="u1", generation=5))
    await backend.prepare(A, pool("a", domain=None, uid="u2", generation=1, addresses=["10.9.0.0/29"]))
    index = backend.ledger.get(A)
    assert index is not None and index.pool_uid == "u2" and index.generation == 1
    got = await backend.allocate(
        A, pool("a", domain=None, uid="u2", addresses=["10.9.0.0/29"]), ClaimContext("ns", "c", "U")
    )
    assert got.address == "10.9.0.1"


async def test_a_prefix_pools_prepared_index_serves_its_first_allocation() -> None:
    from backends.incluster.prefix_backend import IN_CLUSTER_PREFIX_POOL, InClusterPrefixBackend

    ref = IN_CLUSTER_PREFIX_POOL.ref("ns", "p")
    prefix_pool = {
        "metadata": {"name": "p", "namespace": "ns", "generation": 1, "uid": "uid-p"},
        "spec": {"prefixes": ["10.0.0.0/24"], "allocationPrefixLength": 28},
    }
    backend = InClusterPrefixBackend(BackendContext(kube=FakeKube(), cached_addresses=lambda ref: []))
    await backend.prepare(ref, prefix_pool)
    prepared = backend.ledger.get(ref)
    got = await backend.allocate(ref, prefix_pool, ClaimContext("ns", "c", "U"))
    assert (got.address, got.prefix) == ("10.0.0.0", 28)
    assert backend.ledger.get(ref) is prepared, "the index prepared for this pool object, not a rebuilt one"


def test_the_overlap_survey_parses_a_recreated_pool_anew() -> None:
    cached = [pool("a", domain=None), pool("b", domain=None, uid="b1", generation=4)]
    backend = backend_of(FakeKube(), pools=cached)
    allocatable = parse_pool(cached[0])[1]
    overlaps = backend.survey.overlaps(A, allocatable, None)
    assert overlaps is not None and [o.pool for o in overlaps] == [B]
    recreated = pool("b", domain=None, uid="b2", generation=1, addresses=["10.9.0.0/29"])
    backend.observe_pool(IN_CLUSTER_POOL, cached[1], recreated)
    cached[1] = recreated
    assert backend.survey.overlaps(A, allocatable, None) == []


async def test_a_pool_never_removes_the_pin_of_another_pool_of_its_domain() -> None:
    kube = FakeKube()
    pools = [pool("a"), pool("b", preAllocations={"bclaim": "10.0.0.5"})]
    backend = backend_of(kube, pools=pools)
    await backend.allocate(A, pools[0], ClaimContext("ns", "c", "U1"))  # a's index holds the domain's reservations
    await backend.report(B, pools[1], [])  # b pins 10.0.0.5 for its claim ns/bclaim
    pin = kube.stored_all(RESERVATIONS)[-1]
    assert (pin["spec"]["address"], pin["spec"]["claim"]["uid"]) == ("10.0.0.5", "")
    await backend.report(A, pools[0], [Allocation("10.0.0.1", 24, None)])
    assert "10.0.0.5" in [r.address for r in stored_reservations(kube)], "a has no pins, but b's pin is b's"


async def test_a_restored_ipaddress_takes_its_address_back_from_a_release_record() -> None:
    kube = FakeKube()
    backend = backend_of(kube)
    lrr = pool("a", domain=None, allocationStrategy="LeastRecentlyReleased")
    held = await backend.allocate(A, lrr, ClaimContext("ns", "old", "U1"))
    await backend.release(A, lrr, ClaimContext("ns", "old", "U1"), held)
    [record] = stored_reservations(kube)
    assert record.released_at and record.claim_uid == ""
    # A restore brings back an IPAddress for ns/restored naming that address: the address is in use, the claim
    # takes the record over instead of failing as if another claim held it.
    restored = ClaimContext("ns", "restored", "U2")
    assert await backend.allocate(A, lrr, restored, existing=held) == held
    [taken] = stored_reservations(kube)
    assert (taken.claim_uid, taken.claim, taken.released_at) == ("U2", "ns/restored", None)
    # And the next dynamic claim does not get it.
    assert (await backend.allocate(A, lrr, ClaimContext("ns", "new", "U3"))).address != held.address
