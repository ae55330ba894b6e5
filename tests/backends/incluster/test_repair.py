"""The in-cluster backends' repair capability (`backends/incluster/repair.py`) against the real API server, its
methods called directly: leaks released as a claim's release would, pins and release records never released,
reservations deleted behind our back restored, an address held by another claim reported, addresses outside a
shrunk pool, uniqueness-domain pools that never touch each other's reservations, reservations of deleted pools
swept, prefix pools, and the paced, paginated listing."""

from __future__ import annotations

import pytest

from backends.incluster import repair as incluster_repair
from backends.incluster.allocator import holder_seen_from
from backends.incluster.backend import GLOBAL_IN_CLUSTER_POOL, IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.naming import RESERVATIONS, reservation_name
from backends.incluster.prefix_backend import IN_CLUSTER_PREFIX_POOL, InClusterPrefixBackend
from backends.incluster.reservations import Reservation
from ipam_provider.api.capi import ADDRESSES, IPAM_GROUP
from ipam_provider.backend.contract import Allocation, BackendContext, ClaimContext, PoolRef
from ipam_provider.backend.repair import (
    Holding,
    Repairable,
    RestoreOutcome,
)
from ipam_provider.common import Object
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.objects import GLOBAL_POOLS, POOLS, PREFIX_POOLS, global_pool, pool
from tests.system.incluster.test_existing_from_cache import allocate


class CountingPacer:
    """Counts the waits a listing makes (one before each page)."""

    def __init__(self) -> None:
        self.waits = 0

    async def wait(self) -> None:
        self.waits += 1


def repairer(backend: InClusterBackend) -> Repairable:
    found = backend.capabilities().repair
    assert found is not None, "the in-cluster backends offer the repair capability"
    return found


async def holdings_of(backend: InClusterBackend, ref: PoolRef, obj: Object) -> dict[str, Holding]:
    return {h.address: h for h in await repairer(backend).list_holdings(ref, obj, CountingPacer())}


async def stored(kube: KubeClient, ref: PoolRef, address: str, domain: str | None = None) -> Reservation | None:
    found = await kube.get(RESERVATIONS, reservation_name(ref, address, domain))
    return Reservation.parse(found) if found is not None else None


@pytest.fixture
async def backend(kube: KubeClient) -> InClusterBackend:
    return InClusterBackend(BackendContext(kube=kube))


@pytest.mark.parametrize(
    ("spec", "kept"),
    [
        ({}, "deleted"),
        ({"addressReuseGracePeriodSeconds": 3600}, "record"),
        ({"allocationStrategy": "LeastRecentlyReleased"}, "record"),
    ],
    ids=["no-grace", "grace", "least-recently-released"],
)
async def test_a_leak_is_released_as_a_claims_release_would(
    kube: KubeClient, namespace: str, backend: InClusterBackend, spec: dict[str, object], kept: str
) -> None:
    obj = await kube.create(POOLS, pool("leaky", ["10.120.0.10-10.120.0.20"], 24, **spec), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "leaky")
    got = await allocate(backend, ref, obj, ClaimContext(namespace, "gone", "uid-gone"))  # then force-deleted
    holding = (await holdings_of(backend, ref, obj))[got.address]
    assert (holding.claim, holding.claim_uid) == (f"{namespace}/gone", "uid-gone")
    assert holding.created_at is not None
    assert await repairer(backend).release_holding(ref, obj, holding)
    left = await stored(kube, ref, got.address)
    if kept == "deleted":
        assert left is None
    else:
        assert left is not None and left.released_at and left.claim_uid == "", "a release record, as a release makes"
        grace = None if "allocationStrategy" in spec else 3600
        assert left.grace_seconds == grace
        assert (await holdings_of(backend, ref, obj))[got.address].claim_uid == "", "a record is never a leak"
    assert not await repairer(backend).release_holding(ref, obj, holding), "already released: nothing to do"
    # The index learned it: the address is handed out again (a record under LeastRecentlyReleased only last).
    again = await allocate(backend, ref, obj, ClaimContext(namespace, "next", "uid-next"))
    assert (again.address == got.address) is (kept == "deleted"), "a record keeps its address from the next claim"


async def test_a_holding_that_changed_since_it_was_listed_is_kept(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    obj = await kube.create(POOLS, pool("changed", ["10.120.1.10-10.120.1.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "changed")
    got = await allocate(backend, ref, obj, ClaimContext(namespace, "c", "uid-old"))
    listed = (await holdings_of(backend, ref, obj))[got.address]
    # The claim was re-created under its name and took its reservation over (adoption) after the listing.
    reservation = await stored(kube, ref, got.address)
    assert reservation is not None
    await backend.ledger.reservations.reassign(reservation, "uid-new")
    assert not await repairer(backend).release_holding(ref, obj, listed)
    assert (await stored(kube, ref, got.address)) is not None
    gone = Holding("10.120.1.19", f"{namespace}/x", "uid-x", reservation_name(ref, "10.120.1.19"))
    assert not await repairer(backend).release_holding(ref, obj, gone), "no such reservation"


async def test_pins_and_release_records_are_never_released_and_a_pinned_leak_goes_back_to_its_pin(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    obj = await kube.create(
        POOLS,
        pool(
            "pinned",
            ["10.120.2.10-10.120.2.20"],
            24,
            addressReuseGracePeriodSeconds=3600,
            preAllocations={"named": "10.120.2.10", "other": "10.120.2.11"},
        ),
        namespace,
    )
    ref = IN_CLUSTER_POOL.ref(namespace, "pinned")
    assert (await backend.report(ref, obj, [])).ready  # makes the pin reservations
    released_claim = ClaimContext(namespace, "done", "uid-done")
    await backend.release(ref, obj, released_claim, await allocate(backend, ref, obj, released_claim))
    named = ClaimContext(namespace, "named", "uid-named")
    assert (await allocate(backend, ref, obj, named)).address == "10.120.2.10"
    holdings = await holdings_of(backend, ref, obj)
    pin, record, taken = holdings["10.120.2.11"], holdings["10.120.2.12"], holdings["10.120.2.10"]
    assert (pin.claim, pin.claim_uid) == (f"{namespace}/other", "")
    assert record.claim_uid == ""
    for holding in (pin, record):
        assert not await repairer(backend).release_holding(ref, obj, holding)
    assert (await stored(kube, ref, "10.120.2.11")) is not None
    assert (await stored(kube, ref, "10.120.2.12")) is not None
    # The pinned claim force-deleted: its reservation goes back to the pin, as its release would.
    assert await repairer(backend).release_holding(ref, obj, taken)
    back = await stored(kube, ref, "10.120.2.10")
    assert back is not None and (back.claim, back.claim_uid, back.released_at) == (f"{namespace}/named", "", None)


async def test_a_reservation_deleted_behind_our_back_is_restored_for_its_claim(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    obj = await kube.create(POOLS, pool("restore", ["10.120.3.10-10.120.3.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "restore")
    claim = ClaimContext(namespace, "c", "uid-c")
    got = await allocate(backend, ref, obj, claim)
    assert (await repairer(backend).restore(ref, obj, claim, got)).outcome is RestoreOutcome.HELD
    await kube.delete(RESERVATIONS, reservation_name(ref, got.address))
    # The index still shows it held (its steady-state shortcut would answer Held): the restore reads afresh.
    restored = await repairer(backend).restore(ref, obj, claim, got)
    assert restored.outcome is RestoreOutcome.RECORDED, restored
    again = await stored(kube, ref, got.address)
    assert again is not None and (again.claim, again.claim_uid) == (f"{namespace}/c", "uid-c")
    other = await allocate(backend, ref, obj, ClaimContext(namespace, "d", "uid-d"))
    assert other.address != got.address


async def test_a_restore_takes_over_the_claims_own_earlier_reservation_and_the_pools_release_record(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    obj = await kube.create(
        POOLS, pool("takeover", ["10.120.4.10-10.120.4.20"], 24, addressReuseGracePeriodSeconds=3600), namespace
    )
    ref = IN_CLUSTER_POOL.ref(namespace, "takeover")
    earlier = await allocate(backend, ref, obj, ClaimContext(namespace, "c", "uid-before-restore"))
    claim = ClaimContext(namespace, "c", "uid-after-restore")
    assert (await repairer(backend).restore(ref, obj, claim, earlier)).outcome is RestoreOutcome.RECORDED
    held = await stored(kube, ref, earlier.address)
    assert held is not None and held.claim_uid == "uid-after-restore"
    released = ClaimContext(namespace, "r", "uid-r")
    record = await allocate(backend, ref, obj, released)
    await backend.release(ref, obj, released, record)
    back = ClaimContext(namespace, "r", "uid-r2")  # its IPAddress restored from a backup
    assert (await repairer(backend).restore(ref, obj, back, record)).outcome is RestoreOutcome.RECORDED
    taken = await stored(kube, ref, record.address)
    assert taken is not None and (taken.claim_uid, taken.released_at) == ("uid-r2", None)


async def test_an_address_held_by_another_claim_is_reported_taken_and_left_alone(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    obj = await kube.create(POOLS, pool("taken", ["10.120.5.10-10.120.5.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "taken")
    got = await allocate(backend, ref, obj, ClaimContext(namespace, "holder", "uid-holder"))
    duplicate = ClaimContext(namespace, "dup", "uid-dup")
    answer = await repairer(backend).restore(ref, obj, duplicate, got)
    assert answer.outcome is RestoreOutcome.TAKEN
    assert answer.detail == f"claim {namespace}/holder in pool InClusterIPPool/{namespace}/taken"
    held = await stored(kube, ref, got.address)
    assert held is not None and held.claim_uid == "uid-holder"


async def test_addresses_outside_a_shrunk_pool_are_named_and_never_restored(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    obj = await kube.create(POOLS, pool("shrinks", ["10.120.6.10-10.120.6.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "shrinks")
    claim = ClaimContext(namespace, "c", "uid-c")
    got = await allocate(backend, ref, obj, claim)
    shrunk = await kube.patch(POOLS, "shrinks", {"spec": {"addresses": ["10.120.6.15-10.120.6.20"]}}, namespace)
    outside = await repairer(backend).outside_pool(ref, shrunk, [got.address, "10.120.6.16", "10.120.6.1"])
    assert outside == {got.address: "it is not in spec.addresses", "10.120.6.1": "it is not in spec.addresses"}
    assert await repairer(backend).outside_pool(ref, obj, [got.address]) == {}
    again = await repairer(backend).outside_pool(ref, shrunk, [got.address])  # the {} above is remembered for obj's
    assert again == {got.address: "it is not in spec.addresses"}, "an answer is remembered per resourceVersion only"
    await kube.delete(RESERVATIONS, reservation_name(ref, got.address))
    answer = await repairer(backend).restore(ref, shrunk, claim, got)
    assert answer.outcome is RestoreOutcome.OUTSIDE and "not in spec.addresses" in answer.detail
    assert await stored(kube, ref, got.address) is None


async def test_pools_of_a_uniqueness_domain_never_touch_each_others_reservations(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    domain = f"repair-{namespace}"
    addresses = ["10.120.7.10-10.120.7.20"]
    a_obj = await kube.create(POOLS, pool("a", addresses, 24, uniquenessDomain=domain), namespace)
    b_obj = await kube.create(GLOBAL_POOLS, global_pool(f"b-{namespace}", addresses, 24, uniquenessDomain=domain))
    a, b = IN_CLUSTER_POOL.ref(namespace, "a"), GLOBAL_IN_CLUSTER_POOL.ref(None, f"b-{namespace}")
    on_a = await allocate(backend, a, a_obj, ClaimContext(namespace, "on-a", "uid-a"))
    on_b = await allocate(backend, b, b_obj, ClaimContext(namespace, "on-b", "uid-b"))
    assert on_a.address != on_b.address
    a_holdings, b_holdings = await holdings_of(backend, a, a_obj), await holdings_of(backend, b, b_obj)
    assert list(a_holdings) == [on_a.address] and list(b_holdings) == [on_b.address]
    assert not await repairer(backend).release_holding(a, a_obj, b_holdings[on_b.address]), "b's, not a's"
    assert (await stored(kube, b, on_b.address, domain)) is not None
    intruder = ClaimContext(namespace, "on-b", "uid-b")  # even under b's claim's own name and uid
    answer = await repairer(backend).restore(a, a_obj, intruder, on_b)
    assert answer.outcome is RestoreOutcome.TAKEN
    assert answer.detail == f"claim {namespace}/on-b in pool GlobalInClusterIPPool/b-{namespace}"
    kept = await stored(kube, b, on_b.address, domain)
    assert kept is not None and kept.pool == b


async def test_reservations_of_deleted_pools_are_swept_unless_an_ipaddress_names_them(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    backend.repair.orphan_sweep_every = 0.0  # every call sweeps
    sweep = backend.capabilities().sweep_orphaned
    assert sweep is not None
    gone = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "moved-away")
    named = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "moved-with-address")
    young = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "just-gone")
    await backend.ledger.reservations.create(
        gone, Allocation("10.120.8.5", 24, None), ClaimContext(namespace, "ghost", "uid-ghost")
    )
    await backend.ledger.reservations.create(
        named, Allocation("10.120.9.5", 24, None), ClaimContext(namespace, "kept", "uid-kept")
    )
    # The IPAddress of the second one is still there (its move is not finished): its address stays held.
    ipaddress_object = {
        "apiVersion": ADDRESSES.api_version,
        "kind": ADDRESSES.kind,
        "metadata": {"name": "kept"},
        "spec": {
            "claimRef": {"name": "kept"},
            "poolRef": {"apiGroup": IPAM_GROUP, "kind": "InClusterIPPool", "name": "moved-with-address"},
            "address": "10.120.9.5",
            "prefix": 24,
        },
    }
    await kube.create(ADDRESSES, ipaddress_object, namespace)
    assert await sweep(0.0) >= 1
    assert await stored(kube, gone, "10.120.8.5") is None
    assert await stored(kube, named, "10.120.9.5") is not None, "a reservation an IPAddress still names is kept"
    await backend.ledger.reservations.create(
        young, Allocation("10.120.10.5", 24, None), ClaimContext(namespace, "new", "uid-new")
    )
    await sweep(3600.0)
    assert await stored(kube, young, "10.120.10.5") is not None, "younger than the grace period"


async def test_prefix_pools_list_restore_and_name_children_outside(kube: KubeClient, namespace: str) -> None:
    backend = InClusterPrefixBackend(BackendContext(kube=kube))
    body = {
        "apiVersion": PREFIX_POOLS.api_version,
        "kind": PREFIX_POOLS.kind,
        "metadata": {"name": "children"},
        "spec": {"prefixes": ["10.121.0.0/24"], "allocationPrefixLength": 28},
    }
    obj = await kube.create(PREFIX_POOLS, body, namespace)
    ref = IN_CLUSTER_PREFIX_POOL.ref(namespace, "children")
    claim = ClaimContext(namespace, "c", "uid-c")
    got = await allocate(backend, ref, obj, claim)
    assert (got.address, got.prefix) == ("10.121.0.0", 28)
    holding = (await holdings_of(backend, ref, obj))["10.121.0.0"]
    assert holding.claim_uid == "uid-c"
    await kube.delete(RESERVATIONS, reservation_name(ref, got.address))
    assert (await repairer(backend).restore(ref, obj, claim, got)).outcome is RestoreOutcome.RECORDED
    outside = await repairer(backend).outside_pool(ref, obj, ["10.121.0.16", "10.121.0.17", "10.122.0.0"])
    assert set(outside) == {"10.121.0.17", "10.122.0.0"}
    assert await repairer(backend).release_holding(ref, obj, holding)
    assert await stored(kube, ref, got.address) is None
    assert not await repairer(backend).outside_pool(ref, obj, ["10.121.0.0"])
    assert ref in backend.repair.all_inside
    backend.observe_pool(IN_CLUSTER_PREFIX_POOL, obj, None)
    assert ref not in backend.repair.all_inside, "a deleted prefix pool is forgotten"


async def test_the_listing_is_paginated_with_one_wait_before_each_page(
    kube: KubeClient, namespace: str, backend: InClusterBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(incluster_repair, "PAGE_SIZE", 2)
    obj = await kube.create(POOLS, pool("paged", ["10.120.11.10-10.120.11.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "paged")
    for index in range(5):
        await allocate(backend, ref, obj, ClaimContext(namespace, f"c{index}", f"uid-{index}"))
    pacer = CountingPacer()
    holdings = await repairer(backend).list_holdings(ref, obj, pacer)
    assert sorted(h.claim_uid for h in holdings) == [f"uid-{index}" for index in range(5)]
    assert pacer.waits == 3, "three pages of at most two"


async def test_every_pools_holdings_come_from_one_paged_listing(
    kube: KubeClient, namespace: str, backend: InClusterBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass over many pools costs pages of reservations, not a listing per pool; each pool gets what its own
    listing would answer, and a pool that holds nothing gets nothing."""
    monkeypatch.setattr(incluster_repair, "PAGE_SIZE", 4)
    pools = []
    for index in range(6):
        obj = await kube.create(POOLS, pool(f"many-{index}", [f"10.120.{20 + index}.0/29"], 24), namespace)
        ref = IN_CLUSTER_POOL.ref(namespace, f"many-{index}")
        for claim in range(index % 3):
            await allocate(backend, ref, obj, ClaimContext(namespace, f"c{index}-{claim}", f"uid-{index}-{claim}"))
        pools.append((ref, obj))
    pacer = CountingPacer()
    lister = backend.capabilities().list_pools_holdings
    assert lister is not None
    found = await lister(pools, pacer)
    for ref, obj in pools:
        alone = await repairer(backend).list_holdings(ref, obj, CountingPacer())
        assert sorted(found[ref], key=lambda h: h.handle) == sorted(alone, key=lambda h: h.handle)
    assert sum(len(held) for held in found.values()) == 6
    everything, _ = await kube.list(RESERVATIONS)
    assert pacer.waits == -(-len(everything) // 4), "one wait per page of every reservation, whatever the pools"


async def test_a_restore_reads_the_address_in_any_text_form(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    """A restore with an address in another text form (IPv6 written uncompressed) finds the same reservation."""
    obj = await kube.create(POOLS, pool("six", ["fd00:120::10-fd00:120::20"], 64), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "six")
    claim = ClaimContext(namespace, "c", "uid-c")
    got = await allocate(backend, ref, obj, claim)
    long_form = Allocation("fd00:0120:0000:0000:0000:0000:0000:0010", got.prefix, got.gateway)
    assert got.address == "fd00:120::10"
    assert (await repairer(backend).restore(ref, obj, claim, long_form)).outcome is RestoreOutcome.HELD
    assert (await holdings_of(backend, ref, obj)).keys() == {"fd00:120::10"}


async def test_the_sweep_of_deleted_pools_runs_at_most_once_per_ten_minutes(
    kube: KubeClient, namespace: str, backend: InClusterBackend
) -> None:
    now = [1000.0]
    backend.repair.orphan_sweep_clock = lambda: now[0]
    sweep = backend.capabilities().sweep_orphaned
    assert sweep is not None
    await sweep(0.0)  # the first call sweeps
    gone = PoolRef(IPAM_GROUP, "InClusterIPPool", namespace, "gone-later")
    await backend.ledger.reservations.create(
        gone, Allocation("10.120.11.5", 24, None), ClaimContext(namespace, "ghost", "uid-ghost")
    )

    now[0] += 599.0
    assert await sweep(0.0) == 0
    assert await stored(kube, gone, "10.120.11.5") is not None, "not swept again within ten minutes"

    now[0] += 2.0
    assert await sweep(0.0) >= 1
    assert await stored(kube, gone, "10.120.11.5") is None


def test_a_restore_taken_in_a_shared_domain_names_no_other_namespace() -> None:
    """A restore's detail reaches the restoring pool's Events: a holder of another namespace (a pool of a shared
    uniqueness domain, or a Global pool's claim) is described, not named; one of the pool's own namespace is."""

    def held(pool: PoolRef, claim: str, released: str | None = None) -> Reservation:
        return Reservation("d.10-0-0-5", "10.0.0.5", 24, None, "uid-1", claim, released, "1", "u", pool=pool)

    victim = held(IN_CLUSTER_POOL.ref("victim", "secret"), "victim/db")
    shared = held(GLOBAL_IN_CLUSTER_POOL.ref(None, "g"), "victim/db")
    own = held(IN_CLUSTER_POOL.ref("team-a", "other"), "team-a/m1")
    for reservation in (victim, shared, held(IN_CLUSTER_POOL.ref("victim", "secret"), "victim/db", "2026-01-01")):
        text = incluster_repair.holder_text(reservation, "team-a")
        assert "victim" not in text and "secret" not in text and "db" not in text, text
    assert incluster_repair.holder_text(own, "team-a") == "claim team-a/m1 in pool InClusterIPPool/team-a/other"
    assert "victim/db" in incluster_repair.holder_text(victim, None), "a Global pool's Events are the operator's"


def test_a_holder_is_named_on_a_claim_only_within_its_namespace() -> None:
    """`holder_seen_from` feeds a claim's AllocationFailed: another namespace's claim or pool is not named."""

    def held(pool: PoolRef, claim: str) -> Reservation:
        return Reservation("d.10-0-0-5", "10.0.0.5", 24, None, "uid-1", claim, None, "1", "u", pool=pool)

    assert (
        holder_seen_from(held(IN_CLUSTER_POOL.ref("victim", "secret"), "victim/db"), "team-a")
        == "a claim of another namespace"
    )
    assert (
        holder_seen_from(held(GLOBAL_IN_CLUSTER_POOL.ref(None, "g"), "victim/db"), "team-a")
        == "a claim of another namespace"
    )
    own = holder_seen_from(held(GLOBAL_IN_CLUSTER_POOL.ref(None, "g"), "team-a/m1"), "team-a")
    assert own == "claim team-a/m1 of GlobalInClusterIPPool/g"
