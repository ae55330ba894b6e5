"""Prefix pools against the real API server: IPv6 and IPv4 child prefixes, exclusions, exhaustion, release and
reuse, status counts, the cluster-wide kind, concurrent claims from two controllers, invalid pools."""

from __future__ import annotations

import asyncio
import collections
import ipaddress
from typing import Any

import pytest

from backends.incluster.naming import RESERVATIONS
from ipam_provider.api.capi import ADDRESSES, CLAIMS, FINALIZER_PROTECT_POOL
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import (
    GLOBAL_PREFIX_POOLS,
    PREFIX_POOLS,
    claim,
    ready_condition,
    wait_address,
    wait_claim_reason,
)

Object = dict[str, Any]


def prefix_pool(name: str, prefixes: list[str], *, kind: str = "InClusterPrefixPool", **spec: Any) -> Object:
    return {
        "apiVersion": PREFIX_POOLS.api_version,
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"prefixes": prefixes, **spec},
    }


async def claim_children(
    kube: KubeClient, namespace: str, pool_name: str, names: list[str], kind: str = "InClusterPrefixPool"
) -> list[str]:
    """Create a claim per name at once; wait for each; return `address/prefix` per claim, in `names`' order."""
    for name in names:
        await kube.create(CLAIMS, claim(name, pool_name, kind=kind), namespace)
    children = []
    for name in names:
        spec = (await wait_address(kube, namespace, name))["spec"]
        children.append(f"{spec['address']}/{spec['prefix']}")
    return children


async def wait_counts(kube: KubeClient, resource: Resource, name: str, namespace: str | None, **want: int) -> Object:
    seen: dict[str, Any] = {}

    async def counted() -> Object | None:
        pool = await kube.get(resource, name, namespace) or {}
        seen.update(counts=(pool.get("status") or {}).get("ipAddresses"), ready=ready_condition(pool))
        return pool if seen["counts"] == want else None

    return await wait_for(counted, timeout=30, message=lambda: f"pool {name} to count {want}; have {seen}")


def by_address(children: list[str]) -> list[str]:
    return sorted(children, key=lambda text: ipaddress.ip_network(text))


async def test_an_ipv6_48_hands_out_64s_lowest_first_around_exclusions(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    spec: Object = {"gateway": "fd00:10::1", "excludedPrefixes": ["fd00:10:0:1::/64", "fd00:10:0:2::5"]}
    await kube.create(PREFIX_POOLS, prefix_pool("v6", ["fd00:10::/48"], **spec), namespace)
    children = await claim_children(kube, namespace, "v6", ["a", "b", "c"])
    # The gateway blocks nothing (child 0 holds it); an excluded single address blocks the child holding it.
    assert by_address(children) == ["fd00:10::/64", "fd00:10:0:3::/64", "fd00:10:0:4::/64"]
    address = await kube.get(ADDRESSES, "a", namespace)
    assert address is not None and address["spec"]["gateway"] == "fd00:10::1"
    assert address["spec"]["poolRef"] == {
        "apiGroup": "ipam.cluster.x-k8s.io",
        "kind": "InClusterPrefixPool",
        "name": "v6",
    }
    pool = await wait_counts(kube, PREFIX_POOLS, "v6", namespace, total=65534, used=3, free=65531, outOfRange=0)
    condition = ready_condition(pool)
    assert condition is not None and condition["status"] == "True", condition
    assert FINALIZER_PROTECT_POOL in pool["metadata"]["finalizers"]


async def test_an_ipv4_pool_exhausts_releases_and_reuses(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(
        PREFIX_POOLS,
        prefix_pool("v4", ["10.70.0.0/22"], allocationPrefixLength=24, excludedPrefixes=["10.70.1.7"]),
        namespace,
    )
    children = await claim_children(kube, namespace, "v4", ["a", "b", "c"])
    assert by_address(children) == ["10.70.0.0/24", "10.70.2.0/24", "10.70.3.0/24"]
    address = await kube.get(ADDRESSES, "a", namespace)
    assert address is not None and "gateway" not in address["spec"]
    await wait_counts(kube, PREFIX_POOLS, "v4", namespace, total=3, used=3, free=0, outOfRange=0)

    await kube.create(CLAIMS, claim("d", "v4", kind="InClusterPrefixPool"), namespace)
    exhausted = ready_condition(await wait_claim_reason(kube, namespace, "d", "PoolExhausted"))
    assert exhausted is not None and "no free /24 prefix" in exhausted["message"], exhausted
    assert await kube.get(ADDRESSES, "d", namespace) is None

    released = (await kube.get(ADDRESSES, "b", namespace) or {})["spec"]["address"]
    await kube.delete(CLAIMS, "b", namespace)
    reused = await wait_address(kube, namespace, "d")
    assert reused["spec"]["address"] == released and reused["spec"]["prefix"] == 24
    await wait_counts(kube, PREFIX_POOLS, "v4", namespace, total=3, used=3, free=0, outOfRange=0)

    # Excluding an allocated child leaves its IPAddress alone, counted out of range.
    held = (await kube.get(ADDRESSES, "c", namespace) or {})["spec"]["address"]
    await kube.patch(PREFIX_POOLS, "v4", {"spec": {"excludedPrefixes": ["10.70.1.7", f"{held}/24"]}}, namespace)
    await wait_counts(kube, PREFIX_POOLS, "v4", namespace, total=2, used=3, free=0, outOfRange=1)


async def test_a_16_bit_ipv4_pool_of_24s_counts_256(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(PREFIX_POOLS, prefix_pool("big", ["10.0.0.0/16"], allocationPrefixLength=24), namespace)
    assert await claim_children(kube, namespace, "big", ["first"]) == ["10.0.0.0/24"]
    await wait_counts(kube, PREFIX_POOLS, "big", namespace, total=256, used=1, free=255, outOfRange=0)


async def test_a_global_prefix_pool_serves_claims_and_is_protected(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    name = f"{namespace}-prefixes"
    kind = "GlobalInClusterPrefixPool"
    await kube.create(
        GLOBAL_PREFIX_POOLS, prefix_pool(name, ["fd00:20::/56", "fd00:21::/56"], kind=kind, allocationPrefixLength=60)
    )
    try:
        children = await claim_children(kube, namespace, name, ["x", "y"], kind=kind)
        assert by_address(children) == ["fd00:20::/60", "fd00:20:0:10::/60"]
        await wait_counts(kube, GLOBAL_PREFIX_POOLS, name, None, total=32, used=2, free=30, outOfRange=0)
        await kube.delete(GLOBAL_PREFIX_POOLS, name)

        async def held_back() -> Object | None:
            pool = await kube.get(GLOBAL_PREFIX_POOLS, name)
            condition = ready_condition(pool) or {}
            return pool if condition.get("reason") == "Deleting" else None

        await wait_for(held_back, message="the deleted pool to wait for its IPAddresses")
        for claim_name in ("x", "y"):
            await kube.delete(CLAIMS, claim_name, namespace)

        async def gone() -> bool:
            return await kube.get(GLOBAL_PREFIX_POOLS, name) is None

        await wait_for(gone, message="the pool to go once its IPAddresses are released")
    finally:
        await kube.delete(GLOBAL_PREFIX_POOLS, name)


async def test_concurrent_claims_from_two_controllers_get_distinct_children(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(PREFIX_POOLS, prefix_pool("shared", ["fd00:30::/60"]), namespace)  # 16 children
    async with controller_factory(namespaces=[namespace]), controller_factory(namespaces=[namespace]):
        await asyncio.gather(
            *(kube.create(CLAIMS, claim(f"m-{i}", "shared", kind="InClusterPrefixPool"), namespace) for i in range(20))
        )
        reasons: collections.Counter[str] = collections.Counter()

        async def settled() -> bool:
            claims, _ = await kube.list(CLAIMS, namespace)
            reasons.clear()
            reasons.update(str((ready_condition(c) or {}).get("reason")) for c in claims)
            return reasons == {"AddressAllocated": 16, "PoolExhausted": 4}

        await wait_for(settled, timeout=120, message=lambda: f"16 claims served and 4 exhausted; have {reasons}")
        addresses, _ = await kube.list(ADDRESSES, namespace)
        children = [f"{a['spec']['address']}/{a['spec']['prefix']}" for a in addresses]
        assert sorted(children, key=ipaddress.ip_network) == [
            str(n) for n in ipaddress.ip_network("fd00:30::/60").subnets(new_prefix=64)
        ]

        async def one_reservation_each() -> bool:
            reservations, _ = await kube.list(RESERVATIONS)
            mine = [r for r in reservations if r["spec"]["claim"].get("namespace") == namespace]
            return len(mine) == 16 and len({r["spec"]["claim"]["uid"] for r in mine}) == 16

        await wait_for(one_reservation_each, timeout=90, message="one reservation per served claim")


@pytest.mark.parametrize(
    ("prefixes", "message"),
    [
        (["fd00::1"], "provided entry is not a valid IPv6 CIDR"),
        (["fd00::1/64"], "CIDR must be network-aligned"),
        (["fd00::/65"], "CIDR prefix length must be <= allocationPrefixLength"),
    ],
)
async def test_invalid_prefixes_are_refused_with_the_go_message(
    kube: KubeClient, namespace: str, prefixes: list[str], message: str
) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create(PREFIX_POOLS, prefix_pool("bad", prefixes), namespace)
    assert refused.value.status == 422 and message in refused.value.message, refused.value.message


async def test_a_pool_cel_cannot_fault_is_not_ready_and_says_why(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    """A reversed range passes the CRD's entry rule (two IPs around a dash); the backend refuses the pool."""
    spec: Object = {"excludedPrefixes": ["fd00:40::9-fd00:40::1"]}
    await kube.create(PREFIX_POOLS, prefix_pool("reversed", ["fd00:40::/48"], **spec), namespace)
    seen: dict[str, Any] = {}

    async def not_ready() -> bool:
        seen["ready"] = ready_condition(await kube.get(PREFIX_POOLS, "reversed", namespace))
        return (seen["ready"] or {}).get("reason") == "InvalidConfiguration"

    await wait_for(not_ready, message=lambda: f"the pool to be Ready=False/InvalidConfiguration; have {seen}")
    assert seen["ready"]["status"] == "False"
    assert "provided entry is not a valid IP, range, nor CIDR: fd00:40::9-fd00:40::1" in seen["ready"]["message"]
    await kube.create(CLAIMS, claim("waits", "reversed", kind="InClusterPrefixPool"), namespace)
    await wait_claim_reason(kube, namespace, "waits", "PoolNotReady")
    await kube.patch(PREFIX_POOLS, "reversed", {"spec": {"excludedPrefixes": ["fd00:40::1-fd00:40::9"]}}, namespace)
    served = await wait_address(kube, namespace, "waits")
    assert (served["spec"]["address"], served["spec"]["prefix"]) == ("fd00:40:0:1::", 64)


async def test_a_requested_child_prefix_is_granted_by_its_first_address(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(PREFIX_POOLS, prefix_pool("asked", ["fd00:30::/60"]), namespace)
    asking = {REQUESTED_ADDRESS_ANNOTATION: "fd00:30:0:5::"}
    await kube.create(CLAIMS, claim("five", "asked", kind="InClusterPrefixPool", annotations=asking), namespace)
    spec = (await wait_address(kube, namespace, "five"))["spec"]
    assert (spec["address"], spec["prefix"]) == ("fd00:30:0:5::", 64)
    # Inside child 6, but not its first address: a child prefix is asked for by its first address only.
    inside = {REQUESTED_ADDRESS_ANNOTATION: "fd00:30:0:6::1"}
    await kube.create(CLAIMS, claim("unaligned", "asked", kind="InClusterPrefixPool", annotations=inside), namespace)
    unaligned = ready_condition(await wait_claim_reason(kube, namespace, "unaligned", "AllocationFailed"))
    assert unaligned is not None and "is not the first address of a /64 prefix" in unaligned["message"]
    taken = {REQUESTED_ADDRESS_ANNOTATION: "fd00:30:0:5::"}
    await kube.create(CLAIMS, claim("again", "asked", kind="InClusterPrefixPool", annotations=taken), namespace)
    again = ready_condition(await wait_claim_reason(kube, namespace, "again", "AllocationFailed"))
    assert again is not None and f"is already held by claim {namespace}/five" in again["message"]
    assert await kube.get(ADDRESSES, "unaligned", namespace) is None
    assert await kube.get(ADDRESSES, "again", namespace) is None
    children = await claim_children(kube, namespace, "asked", ["dynamic"])
    assert children == ["fd00:30::/64"]
