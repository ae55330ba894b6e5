"""The Infoblox backend's repair capability (`backends/infoblox/repair.py`), called directly as the repair loop calls
it, through the real infoblox-client against the WAPI simulator: a leak is listed, then released; a changed or gone
object is never released; an object deleted behind our back is restored at its address; an address taken by
another object is reported as TAKEN and nothing is created; listing is paged with one pacer wait per page, and a
grid failure during listing raises BackendError instead of answering a partial list."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.spec import ANNOTATION_HOSTNAME, ANNOTATION_REF
from ipam_provider.backend.contract import Allocation, BackendContext, BackendError, ClaimContext, PoolRef
from ipam_provider.backend.repair import Holding, RestoreOutcome
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.infoblox import FAST, Grid

Object = dict[str, Any]
PAGE = 3


class CountingPacer:
    """A pacer that does not wait, and counts how often it was asked to."""

    def __init__(self) -> None:
        self.waits = 0

    async def wait(self) -> None:
        self.waits += 1


def claim_of(namespace: str, name: str) -> ClaimContext:
    return ClaimContext(namespace=namespace, name=name, uid=str(uuid.uuid4()))


@pytest_asyncio.fixture
async def backend(kube: KubeClient) -> AsyncIterator[InfobloxBackend]:
    made = InfobloxBackend(BackendContext(kube=kube), dataclasses.replace(FAST, repair_page_size=PAGE))
    yield made
    await made.close()


async def pool_of(grid: Grid, name: str = "net", **spec: Any) -> tuple[PoolRef, Object]:
    spec = spec or {"subnets": [{"cidr": "10.10.0.0/24", "gateway": "10.10.0.1"}]}
    pool = await grid.create_pool(name, **spec)
    return PoolRef.from_object(pool), pool


async def holdings(backend: InfobloxBackend, ref: PoolRef, pool: Object) -> dict[str, Holding]:
    return {h.address: h for h in await backend.list_holdings(ref, pool, CountingPacer())}


async def test_a_leak_is_listed_with_its_claim_then_released(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    assert backend.capabilities().repair is backend
    ref, pool = await pool_of(grid)
    kept, leaked = claim_of(namespace, "kept"), claim_of(namespace, "leaked")
    kept_at = await backend.allocate(ref, pool, kept)
    leaked_at = await backend.allocate(ref, pool, leaked)
    # Not holdings of this pool: a foreign object, the gateway reservation's kind (CAPI-Pool only), another pool's.
    grid.sim.state.add_fixed_address("10.10.0.50", comment="a printer")
    grid.sim.state.add_fixed_address("10.10.0.51", extattrs={"CAPI-Pool": f"{namespace}/net"})
    other_ref, other_pool = await pool_of(grid, "other", subnets=[{"cidr": "10.10.0.0/24"}])
    await backend.allocate(other_ref, other_pool, claim_of(namespace, "elsewhere"))
    listed = await holdings(backend, ref, pool)
    assert set(listed) == {kept_at.address, leaked_at.address}
    leak = listed[leaked_at.address]
    (obj,) = grid.objects_of(leaked.uid)
    assert (leak.claim, leak.claim_uid, leak.handle) == (f"{namespace}/leaked", leaked.uid, obj["_ref"])
    assert await backend.release_holding(ref, pool, leak) is True
    assert grid.objects_of(leaked.uid) == [] and len(grid.objects_of(kept.uid)) == 1
    assert await backend.release_holding(ref, pool, leak) is False, "already gone"
    assert set(await holdings(backend, ref, pool)) == {kept_at.address}
    left = {o["ipv4addr"] for o in grid.sim.state.objects("fixedaddress")}
    assert left == {"10.10.0.1", kept_at.address, "10.10.0.4", "10.10.0.50", "10.10.0.51"}, "nothing else touched"


async def test_a_changed_object_is_never_released(backend: InfobloxBackend, namespace: str, grid: Grid) -> None:
    ref, pool = await pool_of(grid)
    rekeyed, replaced, moved = (claim_of(namespace, n) for n in ("rekeyed", "replaced", "moved"))
    for claim in (rekeyed, replaced, moved):
        await backend.allocate(ref, pool, claim)
    listed = {h.claim_uid: h for h in await backend.list_holdings(ref, pool, CountingPacer())}
    (first,) = grid.objects_of(rekeyed.uid)
    grid.sim.state.update(first["_ref"], extattrs={**grid.sim.state.extattrs(first["_ref"]), "CAPI-Claim-UID": "new"})
    # Deleted and re-made at the same address by someone else: NIOS gives the new object the same reference.
    (second,) = grid.objects_of(replaced.uid)
    grid.sim.state.delete(second["_ref"])
    foreign = grid.sim.state.add_fixed_address(second["ipv4addr"], comment="someone else's")
    assert foreign == second["_ref"]
    (third,) = grid.objects_of(moved.uid)
    grid.sim.state.update(third["_ref"], extattrs={**grid.sim.state.extattrs(third["_ref"]), "CAPI-Pool": "x/y"})
    for claim in (rekeyed, replaced, moved):
        assert await backend.release_holding(ref, pool, listed[claim.uid]) is False
    assert grid.sim.state.get(first["_ref"]) is not None and grid.sim.state.get(foreign) is not None
    assert grid.sim.state.get(third["_ref"]) is not None
    not_a_claim = dataclasses.replace(listed[rekeyed.uid], claim_uid="")
    assert await backend.release_holding(ref, pool, not_a_claim) is False


async def test_an_object_deleted_behind_our_back_is_restored(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    ref, pool = await pool_of(grid)
    claim = claim_of(namespace, "node")
    allocation = await backend.allocate(ref, pool, claim)
    (obj,) = grid.objects_of(claim.uid)
    grid.sim.state.delete(obj["_ref"])
    restored = await backend.restore(ref, pool, claim, allocation)
    assert restored.outcome is RestoreOutcome.RECORDED, restored
    (again,) = grid.objects_of(claim.uid)
    assert again["ipv4addr"] == allocation.address
    assert grid.sim.state.extattrs(again["_ref"])["CAPI-Claim-Name"] == "node"
    assert (await backend.restore(ref, pool, claim, allocation)).outcome is RestoreOutcome.HELD
    assert len(grid.objects_of(claim.uid)) == 1
    # The allocator's steady state follows: a later allocation of another claim does not get the address.
    assert (await backend.allocate(ref, pool, claim_of(namespace, "next"))).address != allocation.address
    await backend.release(ref, pool, claim, allocation)
    assert grid.objects_of(claim.uid) == []


async def test_ipv6_holdings_are_listed_and_restored(backend: InfobloxBackend, namespace: str, grid: Grid) -> None:
    grid.sim.state.add_network("fd00:10::/64")
    ref, pool = await pool_of(grid, "six", subnets=[{"cidr": "fd00:10::/64"}])
    claim = claim_of(namespace, "six")
    allocation = await backend.allocate(ref, pool, claim)
    (obj,) = grid.objects_of(claim.uid, "ipv6fixedaddress")
    assert [h.handle for h in (await holdings(backend, ref, pool)).values()] == [obj["_ref"]]
    grid.sim.state.delete(obj["_ref"])
    assert (await backend.restore(ref, pool, claim, allocation)).outcome is RestoreOutcome.RECORDED
    (again,) = grid.objects_of(claim.uid, "ipv6fixedaddress")
    assert again["ipv6addr"] == allocation.address
    four = Allocation("10.10.0.9", 24, None)
    assert (await backend.restore(ref, pool, claim, four)).outcome is RestoreOutcome.OUTSIDE


async def test_a_lost_reply_while_restoring_makes_one_object(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    ref, pool = await pool_of(grid)
    claim = claim_of(namespace, "lost")
    allocation = await backend.allocate(ref, pool, claim)
    grid.sim.state.delete(grid.objects_of(claim.uid)[0]["_ref"])
    grid.sim.faults.drop_reply_after_commit(methods="POST", object_types="fixedaddress")
    assert (await backend.restore(ref, pool, claim, allocation)).outcome is RestoreOutcome.RECORDED
    (obj,) = grid.objects_of(claim.uid)
    assert obj["ipv4addr"] == allocation.address


async def test_a_host_record_is_restored_with_its_name(backend: InfobloxBackend, namespace: str, grid: Grid) -> None:
    grid.sim.state.add_zone("nodes.example.com")
    host = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}
    ref, pool = await pool_of(grid, "dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    claim = claim_of(namespace, "web-1")
    allocation = await backend.allocate(ref, pool, claim)
    assert allocation.annotations[ANNOTATION_HOSTNAME] == "web-1.nodes.example.com"
    (record,) = grid.objects_of(claim.uid, "record:host")
    assert set(await holdings(backend, ref, pool)) == {allocation.address}
    grid.sim.state.delete(record["_ref"])
    assert await holdings(backend, ref, pool) == {}
    assert (await backend.restore(ref, pool, claim, allocation)).outcome is RestoreOutcome.RECORDED
    (again,) = grid.objects_of(claim.uid, "record:host")
    assert again["name"] == "web-1.nodes.example.com" and again["ipv4addrs"][0]["ipv4addr"] == allocation.address


async def test_a_release_finds_an_object_recorded_again_as_another_type(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    """The IPAddress's ref annotation names a fixed address (written before the pool became a hostRecord pool); the
    repair loop recorded the address again as a host record: the claim's release still deletes it."""
    grid.sim.state.add_zone("nodes.example.com")
    host = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}
    ref, pool = await pool_of(grid, "moded", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    await backend.allocate(ref, pool, claim_of(namespace, "warm-up"))
    claim = claim_of(namespace, "web-2")
    old = Allocation(
        "10.10.0.44", 24, None, {ANNOTATION_REF: "fixedaddress/ZG5zLmZpeGVkX2FkZHJlc3Mk:10.10.0.44/default"}
    )
    assert (await backend.restore(ref, pool, claim, old)).outcome is RestoreOutcome.RECORDED
    assert len(grid.objects_of(claim.uid, "record:host")) == 1

    await backend.release(ref, pool, claim, old)

    assert grid.objects_of(claim.uid, "record:host") == [] and grid.objects_of(claim.uid) == []


async def test_an_address_taken_by_another_object_is_reported_and_never_handed_out(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    ref, pool = await pool_of(grid)
    claim, rival = claim_of(namespace, "victim"), claim_of(namespace, "rival")
    allocation = await backend.allocate(ref, pool, claim)
    grid.sim.state.delete(grid.objects_of(claim.uid)[0]["_ref"])
    foreign = grid.sim.state.add_fixed_address(allocation.address, comment="a machine outside Kubernetes")
    grid.sim.request_log.reset()
    restored = await backend.restore(ref, pool, claim, allocation)
    assert grid.sim.request_log.count("POST") == 0, "the holder is found by the search, before any POST"
    assert restored.outcome is RestoreOutcome.TAKEN
    assert restored.detail == f"a fixedaddress not managed by this provider ({foreign})"
    assert grid.objects_of(claim.uid) == [] and grid.sim.state.get(foreign) is not None
    assert (await backend.allocate(ref, pool, rival)).address != allocation.address
    # Taken by another claim of ours: named by that claim.
    grid.sim.state.delete(foreign)
    requested = Allocation(allocation.address, 24, "10.10.0.1")
    other = claim_of(namespace, "other")
    assert (await backend.restore(ref, pool, other, requested)).outcome is RestoreOutcome.RECORDED
    restored = await backend.restore(ref, pool, claim, allocation)
    assert restored.outcome is RestoreOutcome.TAKEN and restored.detail.startswith(f"claim {namespace}/other (")
    assert grid.objects_of(claim.uid) == []


@pytest.mark.parametrize("mode", ["fixedAddress", "hostRecord"])
async def test_two_claims_restored_at_one_address_never_both_hold_it(
    backend: InfobloxBackend, namespace: str, grid: Grid, mode: str
) -> None:
    """Two IPAddresses name one address (a duplicate in the cluster) and the grid holds neither: both restores search,
    find it free and POST (the simulator holds each POST, so that in practice both searched first). NIOS refuses the
    second fixed address; two host records may share an address, and the check after the POST keeps only one. The
    assertions hold in any interleaving: one claim holds the address, the other is told who does."""
    spec: dict[str, Any] = {"subnets": [{"cidr": "10.10.0.0/24"}], "mode": mode}
    obj_type = "fixedaddress"
    if mode == "hostRecord":
        grid.sim.state.add_zone("nodes.example.com")
        spec["hostRecord"] = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}
        obj_type = "record:host"
    ref, pool = await pool_of(grid, "twice", **spec)
    await backend.allocate(ref, pool, claim_of(namespace, "warm-up"))
    first, second = claim_of(namespace, "first"), claim_of(namespace, "second")
    both = Allocation("10.10.0.40", 24, None)
    grid.sim.faults.add_latency(1.0, count=2, methods="POST", object_types=obj_type)
    answers = await asyncio.gather(*(backend.restore(ref, pool, c, both) for c in (first, second)))
    outcomes = sorted(a.outcome for a in answers)
    assert outcomes == [RestoreOutcome.RECORDED, RestoreOutcome.TAKEN], answers
    winner, loser = (first, second) if answers[0].outcome is RestoreOutcome.RECORDED else (second, first)
    taken = answers[1] if winner is first else answers[0]
    assert taken.detail.startswith(f"claim {namespace}/{winner.name} (")
    assert len(grid.objects_of(winner.uid, obj_type)) == 1 and grid.objects_of(loser.uid, obj_type) == []
    parsed, connection = await backend.ledger.pool_connection(ref, pool)
    assert backend.allocator.quick(parsed, connection, loser, both) is None, "the index forgot the deleted object"


async def test_a_moved_claim_takes_its_object_over(backend: InfobloxBackend, namespace: str, grid: Grid) -> None:
    ref, pool = await pool_of(grid)
    before = claim_of(namespace, "moved")
    allocation = await backend.allocate(ref, pool, before)
    after = dataclasses.replace(before, uid=str(uuid.uuid4()))  # a `clusterctl move` gives the claim a new uid
    restored = await backend.restore(ref, pool, after, allocation)
    assert restored.outcome is RestoreOutcome.RECORDED and "re-keyed" in restored.detail
    assert grid.objects_of(before.uid) == [] and len(grid.objects_of(after.uid)) == 1


async def test_addresses_outside_the_pool(backend: InfobloxBackend, namespace: str, grid: Grid) -> None:
    ref, pool = await pool_of(grid)
    outside = await backend.outside_pool(ref, pool, ["10.10.0.7", "10.10.1.7", "10.10.0.1", "10.10.0.255", "::1"])
    assert set(outside) == {"10.10.1.7", "10.10.0.1", "10.10.0.255", "::1"}
    assert "in none of the pool's subnets and ranges (network 10.10.0.0/24)" in outside["10.10.1.7"]
    assert "gateway" in outside["10.10.0.1"] and "reserved" in outside["10.10.0.255"]
    before = grid.sim.request_log.count()
    stray = Allocation("10.10.1.7", 24, None)
    restored = await backend.restore(ref, pool, claim_of(namespace, "stray"), stray)
    assert restored.outcome is RestoreOutcome.OUTSIDE and restored.detail == outside["10.10.1.7"]
    assert grid.sim.request_log.count("POST") == 0 and grid.sim.request_log.count() - before <= 2
    broken = {**pool, "spec": {**pool["spec"], "subnets": []}}
    assert await backend.outside_pool(ref, broken, ["10.10.1.7"]) == {}, "an invalid pool cannot tell"


async def test_listing_is_paged_with_one_pacer_wait_per_page(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    ref, pool = await pool_of(grid)
    addresses = {(await backend.allocate(ref, pool, claim_of(namespace, f"c{i}"))).address for i in range(8)}
    grid.sim.request_log.reset()
    pacer = CountingPacer()
    listed = await backend.list_holdings(ref, pool, pacer)
    assert {h.address for h in listed} == addresses and len(listed) == 8
    gets = [r for r in grid.sim.request_log.entries if r.method == "GET"]
    # fixedaddress: 8 objects in pages of 3 -> 3 pages; ipv6fixedaddress and record:host: one empty page each.
    assert [r.object_type for r in gets] == ["fixedaddress"] * 3 + ["ipv6fixedaddress", "record:host"]
    assert pacer.waits == len(gets) == len(grid.sim.request_log.entries)
    assert all(
        "_paging=1" in r.query and "_return_as_object=1" in r.query and "_max_results=3" in r.query for r in gets
    )
    assert ["_page_id=" in r.query for r in gets[:3]] == [False, True, True]
    assert all("network_view=default" in r.query and "%2ACAPI-Pool=" in r.query for r in gets)


class FaultingPacer(CountingPacer):
    """Injects `fault` into the grid just before the listing's `at`-th page: `count` times, or for good."""

    def __init__(self, grid: Grid, fault: str, at: int, count: int) -> None:
        super().__init__()
        self.grid, self.fault, self.at, self.count = grid, fault, at, count

    async def wait(self) -> None:
        await super().wait()
        if self.waits != self.at:
            return
        kinds = {"503": "status", "dropped": "drop", "drop_after_commit": "drop_after_commit"}
        self.grid.sim.faults.add(kinds[self.fault], count=self.count, methods="GET", object_types="fixedaddress")


@pytest.mark.parametrize("fault", ["503", "dropped", "drop_after_commit"])
async def test_a_failing_grid_during_listing_raises_never_answers_partly(
    backend: InfobloxBackend, namespace: str, grid: Grid, fault: str
) -> None:
    ref, pool = await pool_of(grid)
    addresses = {(await backend.allocate(ref, pool, claim_of(namespace, f"c{i}"))).address for i in range(7)}
    # Failing for good from the second page on: no answer at all, after the client's retries.
    with pytest.raises(BackendError):
        await backend.list_holdings(ref, pool, FaultingPacer(grid, fault, at=2, count=10_000))
    answered = [r for r in grid.sim.request_log.entries if r.method == "GET" and r.status == 200]
    assert answered, "the first page was answered, and its objects were not answered as the whole list"
    grid.sim.faults.clear()
    # One failure on the second page: the listing starts again from the first page, and the list is complete.
    pacer = FaultingPacer(grid, fault, at=2, count=1)
    listed = await backend.list_holdings(ref, pool, pacer)
    assert {h.address for h in listed} == addresses and len(listed) == 7
    # 8 objects carry CAPI-Pool (the gateway's reservation too): 3 pages. Two pages, all three again, two types;
    # a dropped request is sent again by urllib3 at once (an idempotent GET), without a new page.
    assert pacer.waits == (3 + 2 if fault == "dropped" else 2 + 3 + 2)
    assert len(grid.sim.state.refs("fixedaddress")) == 8, "nothing was released or changed (7 and the gateway)"
