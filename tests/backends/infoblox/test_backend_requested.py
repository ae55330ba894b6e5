"""The requested-address annotation on the Infoblox backend, through the real infoblox-client against the WAPI
simulator: a fixed address or host record with exactly the requested IP, or AllocationFailed saying it is outside
the pool or held (naming the claim, or the object made outside this provider); an earlier attempt's object is
adopted; two backends racing for one address never both keep it. The backend is called directly, as the reconciler
calls it, except in the last test, which runs the controller.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from backends.infoblox.allocator import Allocator
from backends.infoblox.backend import InfobloxBackend
from backends.infoblox.spec import ANNOTATION_REF
from ipam_provider.backend.contract import (
    REQUESTED_ADDRESS_ANNOTATION,
    Allocation,
    AllocationFailedError,
    BackendContext,
    ClaimContext,
    PoolRef,
)
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.infoblox import FAST, Grid
from tests.support.objects import wait_address, wait_claim_reason

Object = dict[str, Any]
ROUNDS = 20


def asking(namespace: str, name: str, address: str | None) -> ClaimContext:
    annotations = {REQUESTED_ADDRESS_ANNOTATION: address} if address else {}
    return ClaimContext(namespace=namespace, name=name, uid=str(uuid.uuid4()), annotations=annotations)


def at(grid: Grid, obj_type: str, address: str) -> list[Object]:
    """The grid's objects of `obj_type` holding `address`."""
    if obj_type == "record:host":
        return [o for o in grid.sim.state.objects(obj_type) if o["ipv4addrs"][0]["ipv4addr"] == address]
    return [o for o in grid.sim.state.objects(obj_type) if o.get("ipv4addr") == address]


def created(grid: Grid, obj_type: str) -> int:
    """How many POSTs of `obj_type` the grid carried out so far."""
    return sum(
        1 for r in grid.sim.request_log.entries if (r.method, r.object_type, r.status) == ("POST", obj_type, 201)
    )


@pytest_asyncio.fixture
async def backend(kube: KubeClient) -> AsyncIterator[InfobloxBackend]:
    made = InfobloxBackend(BackendContext(kube=kube), FAST)
    yield made
    await made.close()


async def test_requested_fixed_address_is_held_exactly(backend: InfobloxBackend, namespace: str, grid: Grid) -> None:
    pool = await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24", "gateway": "10.10.0.1"}])
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "wants-77", "10.10.0.77")
    allocation = await backend.allocate(ref, pool, claim)
    assert (allocation.address, allocation.prefix, allocation.gateway) == ("10.10.0.77", 24, "10.10.0.1")
    (obj,) = grid.objects_of(claim.uid)
    assert obj["ipv4addr"] == "10.10.0.77" and allocation.annotations[ANNOTATION_REF] == obj["_ref"]
    posts = [r for r in grid.sim.request_log.entries if r.method == "POST" and r.object_type == "fixedaddress"]
    assert posts[-1].json()["ipv4addr"] == "10.10.0.77", "the address is posted literally"
    # Another claim without the annotation gets the next free address as before; the requested one is skipped.
    plain = await backend.allocate(ref, pool, asking(namespace, "plain", None))
    assert plain.address == "10.10.0.2"
    # Fulfilled: what the claim asks for now changes nothing.
    moved = ClaimContext(namespace, "wants-77", claim.uid, annotations={REQUESTED_ADDRESS_ANNOTATION: "10.10.0.99"})
    assert (await backend.allocate(ref, pool, moved, existing=allocation)).address == "10.10.0.77"
    await backend.release(ref, pool, claim, allocation)
    assert grid.objects_of(claim.uid) == []


async def test_requested_ipv6_fixed_address(backend: InfobloxBackend, namespace: str, grid: Grid) -> None:
    grid.sim.state.add_network("2001:db8:10::/64")
    pool = await grid.create_pool("six", subnets=[{"cidr": "2001:db8:10::/64"}])
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "six", "2001:db8:10::50")
    allocation = await backend.allocate(ref, pool, claim)
    assert (allocation.address, allocation.prefix) == ("2001:db8:10::50", 64)
    (obj,) = grid.objects_of(claim.uid, "ipv6fixedaddress")
    assert obj["ipv6addr"] == "2001:db8:10::50"
    with pytest.raises(AllocationFailedError, match="subnet-router anycast"):
        await backend.allocate(ref, pool, asking(namespace, "anycast", "2001:db8:10::"))
    with pytest.raises(AllocationFailedError, match=f"already held by claim {namespace}/six"):
        await backend.allocate(ref, pool, asking(namespace, "again", "2001:db8:10:0::50"))


async def test_outside_the_pool_is_refused_with_the_reason(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    grid.sim.state.add_network("10.20.0.0/24")
    grid.sim.state.add_range("10.20.0.100", "10.20.0.110")
    pool = await grid.create_pool(
        "strict",
        subnets=[{"cidr": "10.10.0.0/24", "gateway": "10.10.0.1"}],
        ranges=[{"start": "10.20.0.100", "end": "10.20.0.110", "prefix": 24}],
    )
    ref = PoolRef.from_object(pool)
    cases = {
        "192.0.2.7": "",
        "10.20.0.111": "",
        "10.10.0.0": "(a reserved address of network 10.10.0.0/24",
        "10.10.0.255": "(a reserved address of network 10.10.0.0/24",
        "10.10.0.1": "(the gateway of network 10.10.0.0/24)",
        "2001:db8::5": "",
    }
    await backend.allocate(ref, pool, asking(namespace, "warm-up", None))
    before = grid.sim.request_log.count()
    for address, why in cases.items():
        with pytest.raises(AllocationFailedError) as failure:
            await backend.allocate(ref, pool, asking(namespace, "out", address))
        assert failure.value.message.startswith(f"requested address {address} is outside {ref}{' ' if why else ';'}")
        assert why in failure.value.message
    assert grid.sim.request_log.count() == before, "an address outside the pool costs no WAPI request"
    in_range = await backend.allocate(ref, pool, asking(namespace, "ranged", "10.20.0.105"))
    assert (in_range.address, in_range.prefix) == ("10.20.0.105", 24)
    with pytest.raises(AllocationFailedError, match="not an IP address"):
        await backend.allocate(ref, pool, asking(namespace, "bad", "10.10.0.300"))


async def test_held_by_another_claim_or_by_an_object_of_someone_else(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    printer = grid.sim.state.add_fixed_address("10.10.0.5", comment="a printer")
    pool = await grid.create_pool("busy", subnets=[{"cidr": "10.10.0.0/24"}])
    ref = PoolRef.from_object(pool)
    first = await backend.allocate(ref, pool, asking(namespace, "first", "10.10.0.9"))
    assert first.address == "10.10.0.9"
    second = asking(namespace, "second", "10.10.0.9")
    with pytest.raises(AllocationFailedError) as failure:
        await backend.allocate(ref, pool, second)
    assert failure.value.message == (
        f"requested address 10.10.0.9 is already held by claim {namespace}/first in {ref}; request another address"
    )
    third = asking(namespace, "third", "10.10.0.5")
    with pytest.raises(AllocationFailedError) as failure:
        await backend.allocate(ref, pool, third)
    assert f"held by a fixedaddress not managed by this provider ({printer})" in failure.value.message
    assert grid.objects_of(second.uid) == [] and grid.objects_of(third.uid) == []
    assert [o["_ref"] for o in at(grid, "fixedaddress", "10.10.0.5")] == [printer]


async def test_an_earlier_attempt_is_adopted(kube: KubeClient, namespace: str, grid: Grid) -> None:
    pool = await grid.create_pool("again", subnets=[{"cidr": "10.10.0.0/24"}])
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "crashed", "10.10.0.30")
    crashed = InfobloxBackend(BackendContext(kube=kube), FAST)
    try:
        before_crash = await crashed.allocate(ref, pool, claim)  # made on the grid, then the process "died"
    finally:
        await crashed.close()
    restarted = InfobloxBackend(BackendContext(kube=kube), FAST)
    try:
        posts = grid.sim.request_log.count("POST", "fixedaddress")
        again = await restarted.allocate(ref, pool, claim)
        assert again.address == "10.10.0.30"
        assert again.annotations[ANNOTATION_REF] == before_crash.annotations[ANNOTATION_REF]
        assert grid.sim.request_log.count("POST", "fixedaddress") == posts, "adopted, not posted again"
        assert len(grid.objects_of(claim.uid)) == 1
    finally:
        await restarted.close()


async def test_requested_host_record_and_a_foreign_host_at_that_address(
    backend: InfobloxBackend, namespace: str, grid: Grid
) -> None:
    grid.sim.state.add_zone("nodes.example.com")
    foreign = grid.sim.state.add_host_record("web.nodes.example.com", "10.10.0.60", configure_for_dns=True)
    host = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}
    pool = await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "node-a", "10.10.0.61")
    allocation = await backend.allocate(ref, pool, claim)
    assert allocation.address == "10.10.0.61"
    (record,) = grid.objects_of(claim.uid, "record:host")
    assert record["name"] == "node-a.nodes.example.com" and record["ipv4addrs"][0]["ipv4addr"] == "10.10.0.61"
    taken = asking(namespace, "node-b", "10.10.0.60")
    with pytest.raises(AllocationFailedError) as failure:
        await backend.allocate(ref, pool, taken)
    assert f"held by a record:host not managed by this provider ({foreign})" in failure.value.message
    assert grid.objects_of(taken.uid, "record:host") == []


@pytest.mark.parametrize("mode", ["fixedAddress", "hostRecord"])
async def test_two_backends_racing_for_one_address_never_both_keep_it(
    kube: KubeClient, namespace: str, grid: Grid, mode: str
) -> None:
    """Two independent backends (two controller processes) ask for one address at once, 20 times. NIOS refuses a
    second fixed address, but lets two host records share an address: there the check after the POST decides.
    The simulator holds each POST for a moment, so that both backends have searched before either object exists.
    A claim that gave way to a racer asks again after its short random `retry_after`, as the reconciler would;
    every round ends with exactly one claim holding the address within a few attempts."""
    spec: dict[str, Any] = {"subnets": [{"cidr": "10.10.0.0/24"}], "mode": mode}
    obj_type = "fixedaddress"
    if mode == "hostRecord":
        grid.sim.state.add_zone("race.example.com")
        spec["hostRecord"] = {"dnsZone": "race.example.com", "hostnameSource": "claimName"}
        obj_type = "record:host"
    pool = await grid.create_pool("race", **spec)
    ref = PoolRef.from_object(pool)
    backends = [InfobloxBackend(BackendContext(kube=kube), FAST) for _ in range(2)]

    async def attempt(backend: InfobloxBackend, claim: ClaimContext, delay: float) -> Allocation:
        await asyncio.sleep(delay)
        return await backend.allocate(ref, pool, claim)

    try:
        for index, backend in enumerate(backends):  # warm: the instance checked, the pool indexed
            await backend.allocate(ref, pool, asking(namespace, f"warm-{index}", None))
        both_posted = 0
        for round_number in range(ROUNDS):
            address = f"10.10.0.{100 + round_number}"
            claims = [asking(namespace, f"r{round_number}-{i}", address) for i in range(2)]
            grid.sim.faults.add_latency(0.3, count=2, methods="POST", object_types=obj_type)
            delays = [0.0, 0.0]
            won: list[tuple[ClaimContext, Allocation]] = []
            for retry in range(4):
                created_before = created(grid, obj_type)
                results = await asyncio.gather(
                    *(attempt(b, c, d) for b, c, d in zip(backends, claims, delays, strict=True)),
                    return_exceptions=True,
                )
                won += [(c, r) for c, r in zip(claims, results, strict=True) if isinstance(r, Allocation)]
                lost = [r for r in results if isinstance(r, AllocationFailedError)]
                assert len(lost) == sum(not isinstance(r, Allocation) for r in results), f"{round_number}: {results}"
                assert len(won) <= 1, f"round {round_number}: both claims got {address}"
                for failure in lost:
                    assert f"requested address {address} is already held by " in failure.message
                raced = created(grid, obj_type) - created_before == 2
                if raced and retry == 0:
                    both_posted += 1
                if raced:  # both passed the first search: whoever gave way gave way to a racer
                    assert all(f.retry_after is not None and 1.0 <= f.retry_after <= 3.0 for f in lost), lost
                if won:
                    break
                delays = [f.retry_after or 0.0 if isinstance(f, AllocationFailedError) else 0.0 for f in results]
            assert len(won) == 1, f"round {round_number}: no claim got {address} within 4 attempts"
            left = at(grid, obj_type, address)
            assert [o["_ref"] for o in left] == [won[0][1].annotations[ANNOTATION_REF]], f"{round_number}: {left}"
        print(f"\n{mode}: {both_posted} of {ROUNDS} rounds had both objects created")
        if mode == "hostRecord":
            assert both_posted > 0, "the grid never held two host records at once: the check was not exercised"
    finally:
        for backend in backends:
            await backend.close()


async def test_through_the_controller_free_taken_and_outside(
    kube: KubeClient, namespace: str, grid: Grid, infoblox_controller: Any
) -> None:
    printer = grid.sim.state.add_fixed_address("10.10.0.5", comment="a printer")
    await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24", "gateway": "10.10.0.1"}])
    ask = REQUESTED_ADDRESS_ANNOTATION
    async with infoblox_controller():
        await grid.create_claim("free", "net", annotations={ask: "10.10.0.42"})
        address = await wait_address(kube, namespace, "free")
        assert address["spec"]["address"] == "10.10.0.42" and address["spec"]["gateway"] == "10.10.0.1"
        await grid.create_claim("same", "net", annotations={ask: "10.10.0.42"})
        await grid.create_claim("printer", "net", annotations={ask: "10.10.0.5"})
        await grid.create_claim("outside", "net", annotations={ask: "10.99.0.1"})
        messages = {}
        for name in ("same", "printer", "outside"):
            failed = await wait_claim_reason(kube, namespace, name, "AllocationFailed")
            messages[name] = next(c for c in failed["status"]["conditions"] if c["type"] == "Ready")["message"]
        pool = f"InfobloxIPPool/{namespace}/net"
        assert messages["same"] == (
            f"requested address 10.10.0.42 is already held by claim {namespace}/free in {pool}; request another address"
        )
        assert f"held by a fixedaddress not managed by this provider ({printer})" in messages["printer"]
        assert messages["outside"] == f"requested address 10.99.0.1 is outside {pool}; request an address of the pool"
        assert [o.get("ipv4addr") for o in grid.sim.state.objects("fixedaddress")].count("10.10.0.42") == 1


async def test_crash_between_post_and_check_then_annotation_removed(
    kube: KubeClient, namespace: str, grid: Grid, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stops after posting a requested host record and before its keep-if-alone check, while another
    host record takes the address; the claim's annotation is then removed. The next process finds the object by the
    claim's UID (the pool index): it was made for a requested address (its comment says so), so it is checked before
    it is handed out, found shared, deleted, and the claim gets another address."""
    grid.sim.state.add_zone("nodes.example.com")
    host = {"dnsZone": "nodes.example.com", "hostnameSource": "claimName"}
    pool = await grid.create_pool("dns", subnets=[{"cidr": "10.10.0.0/24"}], mode="hostRecord", hostRecord=host)
    ref = PoolRef.from_object(pool)
    claim = asking(namespace, "node-a", "10.10.0.61")

    async def crash(*_: Any) -> None:
        raise RuntimeError("the process stops here")

    crashing = InfobloxBackend(BackendContext(kube=kube), FAST)
    try:
        monkeypatch.setattr(Allocator, "keep_alone", crash)
        with pytest.raises(RuntimeError):
            await crashing.allocate(ref, pool, claim)
    finally:
        await crashing.close()
    monkeypatch.undo()
    (made,) = grid.objects_of(claim.uid, "record:host")
    assert made["comment"].startswith("Cluster API IPAddressClaim, requested address: ")
    foreign = grid.sim.state.add_host_record("web.nodes.example.com", "10.10.0.61", configure_for_dns=True)
    plain = ClaimContext(namespace, claim.name, claim.uid)  # the annotation removed
    restarted = InfobloxBackend(BackendContext(kube=kube), FAST)
    try:
        allocation = await restarted.allocate(ref, pool, plain)
    finally:
        await restarted.close()
    assert allocation.address != "10.10.0.61"
    assert [o["_ref"] for o in at(grid, "record:host", "10.10.0.61")] == [foreign]
    (kept,) = grid.objects_of(claim.uid, "record:host")
    assert kept["_ref"] == allocation.annotations[ANNOTATION_REF]


async def test_after_a_restore_the_claims_earlier_object_is_rekeyed_not_held(
    kube: KubeClient, namespace: str, grid: Grid
) -> None:
    """A restore (or `clusterctl move`) gives the claim a new UID before its IPAddress exists: its object at the
    requested address, recorded for the same namespace, name and pool, is re-keyed and kept, not reported as held by
    the claim itself. One recorded for another claim name stays held."""
    pool = await grid.create_pool("net", subnets=[{"cidr": "10.10.0.0/24"}])
    ref = PoolRef.from_object(pool)
    before = asking(namespace, "restored", "10.10.0.44")
    first = InfobloxBackend(BackendContext(kube=kube), FAST)
    try:
        made = await first.allocate(ref, pool, before)
    finally:
        await first.close()
    after = ClaimContext(namespace, "restored", str(uuid.uuid4()), annotations=before.annotations)
    restarted = InfobloxBackend(BackendContext(kube=kube), FAST)
    try:
        allocation = await restarted.allocate(ref, pool, after)
        with pytest.raises(AllocationFailedError) as failure:
            await restarted.allocate(ref, pool, asking(namespace, "other", "10.10.0.44"))
    finally:
        await restarted.close()
    assert allocation.address == "10.10.0.44"
    assert allocation.annotations[ANNOTATION_REF] == made.annotations[ANNOTATION_REF]
    assert grid.objects_of(before.uid) == [] and len(grid.objects_of(after.uid)) == 1
    assert f"held by claim {namespace}/restored" in failure.value.message
