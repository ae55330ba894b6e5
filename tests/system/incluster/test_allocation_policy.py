"""Allocation policies against the real API server: the KEP-3070 static band, and LeastRecentlyReleased's order,
kept in the API server (across a controller restart) and decided there between two processes."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from backends.incluster.backend import IN_CLUSTER_POOL, InClusterBackend
from backends.incluster.naming import RESERVATIONS, reservation_name
from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.contract import BackendContext, ClaimContext, PoolExhaustedError
from ipam_provider.common import Object
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import POOLS, claim, pool, wait_address, wait_claim_reason
from tests.system.incluster.test_existing_from_cache import allocate


def addresses(first: str, last: str) -> set[str]:
    low, high = int(ipaddress.ip_address(first)), int(ipaddress.ip_address(last))
    return {str(ipaddress.ip_address(value)) for value in range(low, high + 1)}


async def fulfil(kube: KubeClient, namespace: str, pool_name: str, names: list[str]) -> set[str]:
    for name in names:
        await kube.create(CLAIMS, claim(name, pool_name), namespace)
    return {(await wait_address(kube, namespace, name))["spec"]["address"] for name in names}


@pytest.mark.parametrize("strategy", ["LowestFree", "Random"])
async def test_dynamic_claims_fill_the_addresses_above_the_band_first(
    kube: KubeClient, namespace: str, in_process_controller: Controller, strategy: str
) -> None:
    # 20 allocatable addresses: the band is the lowest 16 (.1-.16), 4 lie above it.
    spec = {"reserveStaticBand": True, "allocationStrategy": strategy}
    await kube.create(POOLS, pool("banded", ["10.41.0.1-10.41.0.20"], 24, **spec), namespace)
    above = await fulfil(kube, namespace, "banded", [f"above-{i}" for i in range(4)])
    assert above == addresses("10.41.0.17", "10.41.0.20"), "every dynamic address comes from above the band first"
    band = await fulfil(kube, namespace, "banded", [f"band-{i}" for i in range(16)])
    assert band == addresses("10.41.0.1", "10.41.0.16"), "then from the band"
    await kube.create(CLAIMS, claim("one-too-many", "banded"), namespace)
    await wait_claim_reason(kube, namespace, "one-too-many", "PoolExhausted")


async def wait_released(kube: KubeClient, ref_namespace: str, address: str) -> Object:
    name = reservation_name(IN_CLUSTER_POOL.ref(ref_namespace, "lrr"), address)

    async def released() -> Object | None:
        record = await kube.get(RESERVATIONS, name)
        return record if record is not None and record["spec"].get("releasedAt") else None

    return await wait_for(released, message=f"a release record for {address}")


async def test_least_recently_released_order_survives_a_controller_restart(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(
        POOLS, pool("lrr", ["10.42.0.1-10.42.0.5"], 24, allocationStrategy="LeastRecentlyReleased"), namespace
    )
    async with controller_factory(namespaces=[namespace]):
        held = {}
        for name in ("a", "b", "c", "d"):  # one at a time: never-used addresses go lowest first
            held[name] = (await fulfil(kube, namespace, "lrr", [name])).pop()
        assert [held[name] for name in "abcd"] == ["10.42.0.1", "10.42.0.2", "10.42.0.3", "10.42.0.4"]
        # Released in the order c, a, d, at least a second apart (releasedAt has a resolution of one second), so
        # that the order is neither the addresses' nor the claims'.
        for name in ("c", "a", "d"):
            await kube.delete(CLAIMS, name, namespace)
            await wait_released(kube, namespace, held[name])
            await asyncio.sleep(1.1)
    async with controller_factory(namespaces=[namespace]):
        assert await fulfil(kube, namespace, "lrr", ["e"]) == {"10.42.0.5"}, "the never-used address goes first"
        reused = [(await fulfil(kube, namespace, "lrr", [name])).pop() for name in ("f", "g", "h")]
        assert reused == [held["c"], held["a"], held["d"]], "then the address released longest ago"
        await kube.create(CLAIMS, claim("i", "lrr"), namespace)
        await wait_claim_reason(kube, namespace, "i", "PoolExhausted")
    record = await kube.get(RESERVATIONS, reservation_name(IN_CLUSTER_POOL.ref(namespace, "lrr"), held["c"]))
    assert record is not None and "releasedAt" not in record["spec"] and record["spec"]["claim"]["name"] == "f"


async def test_two_processes_taking_over_the_same_release_record_cannot_both_win(
    kube: KubeClient, namespace: str
) -> None:
    spec = {"allocationStrategy": "LeastRecentlyReleased"}
    obj = await kube.create(POOLS, pool("lrr", ["10.43.0.1-10.43.0.2"], 24, **spec), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "lrr")
    first, second = (InClusterBackend(BackendContext(kube=kube)) for _ in range(2))
    try:
        gone = ClaimContext(namespace, "gone", "uid-gone")
        allocation = await allocate(first, ref, obj, gone)
        assert allocation.address == "10.43.0.1"
        await first.release(ref, obj, gone, allocation)
        # The second process builds its index now: it knows 10.43.0.1 as a release record, as the first does.
        assert (await allocate(second, ref, obj, ClaimContext(namespace, "y", "uid-y"))).address == "10.43.0.2"
        taken = await allocate(first, ref, obj, ClaimContext(namespace, "p", "uid-p"))
        assert taken.address == "10.43.0.1", "the first process took the record over"
        # The second process's take-over carries the record's old resourceVersion: the API server refuses it.
        with pytest.raises(PoolExhaustedError):
            await allocate(second, ref, obj, ClaimContext(namespace, "q", "uid-q"))
        record = await kube.get(RESERVATIONS, reservation_name(ref, "10.43.0.1"))
        assert record is not None and record["spec"]["claim"]["uid"] == "uid-p"
    finally:
        await first.close()
        await second.close()


async def test_a_spec_change_of_the_policy_applies_to_the_next_allocation(kube: KubeClient, namespace: str) -> None:
    obj = await kube.create(POOLS, pool("policy", ["10.44.0.1-10.44.0.20"], 24), namespace)
    ref = IN_CLUSTER_POOL.ref(namespace, "policy")
    backend = InClusterBackend(BackendContext(kube=kube))
    try:
        assert (await allocate(backend, ref, obj, ClaimContext(namespace, "a", "uid-a"))).address == "10.44.0.1"
        banded = await kube.patch(POOLS, "policy", {"spec": {"reserveStaticBand": True}}, namespace)
        assert (await allocate(backend, ref, banded, ClaimContext(namespace, "b", "uid-b"))).address == "10.44.0.17"
        plain = await kube.patch(POOLS, "policy", {"spec": {"reserveStaticBand": False}}, namespace)
        assert (await allocate(backend, ref, plain, ClaimContext(namespace, "c", "uid-c"))).address == "10.44.0.2"
        assert plain["spec"]["allocationStrategy"] == "LowestFree", "the CRD's default"
    finally:
        await backend.close()


async def test_a_requested_address_takes_over_its_release_record_and_a_changed_prefix_reserves_it_anew(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    """Under LeastRecentlyReleased a released address keeps its record; another claim that requests the address takes
    the record over (the same reservation, now its). A record made under another prefix is never rewritten (the
    reservation's CEL rule): it is deleted and the address reserved anew with the pool's prefix."""
    spec = {"allocationStrategy": "LeastRecentlyReleased"}
    await kube.create(POOLS, pool("lrr", ["10.43.0.1-10.43.0.5"], 24, **spec), namespace)
    name = reservation_name(IN_CLUSTER_POOL.ref(namespace, "lrr"), "10.43.0.1")
    for round_, (holder, taker) in enumerate([("a", "b"), ("b", "c")]):
        if round_ == 0:
            assert await fulfil(kube, namespace, "lrr", [holder]) == {"10.43.0.1"}
        await kube.delete(CLAIMS, holder, namespace)
        record = await wait_released(kube, namespace, "10.43.0.1")
        if round_ == 1:  # the pool's prefix changes while the address is released
            await kube.patch(POOLS, "lrr", {"spec": {"prefix": 25}}, namespace)
        wish = {"ipam.cluster.x-k8s.io/requested-address": "10.43.0.1"}
        await kube.create(CLAIMS, claim(taker, "lrr", annotations=wish), namespace)
        address = await wait_address(kube, namespace, taker)
        assert address["spec"]["address"] == "10.43.0.1"
        now = await kube.get(RESERVATIONS, name)
        assert now is not None and not now["spec"].get("releasedAt") and now["spec"]["claim"]["name"] == taker
        taken_over = now["metadata"]["uid"] == record["metadata"]["uid"]
        assert taken_over == (round_ == 0), "taken over under the same prefix; reserved anew under another"
        assert now["spec"]["prefix"] == address["spec"]["prefix"] == (24 if round_ == 0 else 25)
