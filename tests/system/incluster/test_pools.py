"""In-cluster pools against the real API server: allocatable sets, scopes, status, validation, protection."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import pytest

from ipam_provider.api.capi import ADDRESSES, ANNOTATION_SKIP_DELETE_VALIDATION, CLAIMS, FINALIZER_PROTECT_POOL
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from tests.support.cluster import wait_for
from tests.support.objects import (
    GLOBAL_POOLS,
    POOLS,
    claim,
    global_pool,
    pool,
    ready_condition,
    wait_address,
    wait_claim_reason,
)


async def claim_all(kube: KubeClient, namespace: str, pool_name: str, count: int, **kwargs: Any) -> list[str]:
    names = [f"{pool_name}-{kwargs.get('kind', 'ns')[:6].lower()}-{i}" for i in range(count)]
    for name in names:
        await kube.create(CLAIMS, claim(name, pool_name, **kwargs), namespace)
    return [(await wait_address(kube, namespace, name))["spec"]["address"] for name in names]


async def pool_status(kube: KubeClient, namespace: str | None, name: str, expected: dict[str, int]) -> dict[str, Any]:
    resource = POOLS if namespace else GLOBAL_POOLS

    async def probe() -> dict[str, Any] | None:
        obj = await kube.get(resource, name, namespace)
        counts = ((obj or {}).get("status") or {}).get("ipAddresses")
        return obj if counts == expected else None

    async def last() -> str:
        obj = await kube.get(resource, name, namespace)
        return f"status {expected}, have {(obj or {}).get('status')}"

    return await wait_for(probe, timeout=15, message=f"pool {name} to report {expected}")


async def test_exclusions_reserved_addresses_gateway_order_and_single_ips(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    spec = {"gateway": "10.30.0.3", "excludedAddresses": ["10.30.0.5-10.30.0.6", "10.30.0.9"]}
    # Out of order, with a single IP and a range; .0 is the network address, .15 the broadcast of the /28.
    await kube.create(
        POOLS,
        pool("mixed", ["10.30.0.12", "10.30.0.0/29", "10.30.0.8-10.30.0.10", "10.30.0.15"], 28, **spec),
        namespace,
    )
    addresses = await claim_all(kube, namespace, "mixed", 6)
    # Which claim gets which address depends on retry order; the set handed out is exact.
    assert sorted(addresses, key=ipaddress.ip_address) == [
        "10.30.0.1",
        "10.30.0.2",
        "10.30.0.4",
        "10.30.0.7",
        "10.30.0.8",
        "10.30.0.10",
    ]
    await kube.create(CLAIMS, claim("one-more", "mixed"), namespace)
    more = await wait_address(kube, namespace, "one-more")
    assert more["spec"]["address"] == "10.30.0.12"
    await kube.create(CLAIMS, claim("too-many", "mixed"), namespace)
    await wait_claim_reason(kube, namespace, "too-many", "PoolExhausted")
    await pool_status(kube, namespace, "mixed", {"total": 7, "used": 7, "free": 0, "outOfRange": 0})


async def test_allocate_reserved_addresses_hands_out_network_and_broadcast(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("all", ["10.31.0.0/30"], 30, allocateReservedIPAddresses=True), namespace)
    assert sorted(await claim_all(kube, namespace, "all", 4)) == ["10.31.0.0", "10.31.0.1", "10.31.0.2", "10.31.0.3"]


async def claimed_and_released(kube: KubeClient, namespace: str, name: str, addresses: str, grace: int) -> str:
    """Makes pool `name` with a reuse grace period, has its first claim fulfilled and deletes that claim (named
    `<name>-ns-0`); returns the address it got."""
    await kube.create(POOLS, pool(name, [addresses], 24, addressReuseGracePeriodSeconds=grace), namespace)
    [address] = await claim_all(kube, namespace, name, 1)
    await kube.delete(CLAIMS, f"{name}-ns-0", namespace)
    return address


async def test_a_released_address_is_not_reused_within_the_grace_period(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    grace = 4
    assert await claimed_and_released(kube, namespace, "graceful", "10.36.0.1-10.36.0.6", grace) == "10.36.0.1"

    async def released() -> bool:
        return await kube.get(CLAIMS, "graceful-ns-0", namespace) is None

    await wait_for(released, message="the first claim to be released")
    released_at = asyncio.get_running_loop().time()
    await kube.create(CLAIMS, claim("during", "graceful"), namespace)
    during = (await wait_address(kube, namespace, "during"))["spec"]["address"]
    if asyncio.get_running_loop().time() - released_at < grace:
        assert during == "10.36.0.2", "a released address stays unused during its grace period"
    await asyncio.sleep(max(0.0, grace + 0.5 - (asyncio.get_running_loop().time() - released_at)))
    await kube.create(CLAIMS, claim("after", "graceful"), namespace)
    assert (await wait_address(kube, namespace, "after"))["spec"]["address"] == "10.36.0.1", "reused after it"


async def test_a_released_address_is_not_counted_free_until_its_grace_period_is_over(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    assert await claimed_and_released(kube, namespace, "counted", "10.37.0.1-10.37.0.4", 4) == "10.37.0.1"
    during = await pool_status(kube, namespace, "counted", {"total": 4, "used": 0, "free": 3, "outOfRange": 0})
    [ready] = [c for c in during["status"]["conditions"] if c["type"] == "Ready"]
    assert ready["message"] == "3 of 4 addresses free; 1 released addresses wait out addressReuseGracePeriodSeconds"
    # Nothing changes after this: the pool is reported again because its report said when the grace period ends
    # (the controller's sync period is 10 minutes).
    await pool_status(kube, namespace, "counted", {"total": 4, "used": 0, "free": 4, "outOfRange": 0})


async def test_namespaced_and_global_pools_with_the_same_name_are_distinct(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    global_name = f"shared-{namespace}"
    await kube.create(POOLS, pool(global_name, ["10.32.0.10-10.32.0.12"], 24), namespace)
    await kube.create(GLOBAL_POOLS, global_pool(global_name, ["10.33.0.10-10.33.0.12"], 24))
    try:
        local = await claim_all(kube, namespace, global_name, 2)
        shared = await claim_all(kube, namespace, global_name, 2, kind="GlobalInClusterIPPool")
        assert sorted(local) == ["10.32.0.10", "10.32.0.11"]
        assert sorted(shared) == ["10.33.0.10", "10.33.0.11"]
        address = await kube.get(ADDRESSES, f"{global_name}-global-0", namespace)
        assert address is not None and address["spec"]["poolRef"]["kind"] == "GlobalInClusterIPPool"
        await pool_status(kube, None, global_name, {"total": 3, "used": 2, "free": 1, "outOfRange": 0})
    finally:
        for i in range(2):
            await kube.delete(CLAIMS, f"{global_name}-global-{i}", namespace)


async def test_ipv6_pool(kube: KubeClient, namespace: str, in_process_controller: Controller) -> None:
    await kube.create(POOLS, pool("v6", ["fd00:10::/64"], 64, gateway="fd00:10::1"), namespace)
    # ::0 is the subnet-router anycast address, ::1 the gateway.
    assert sorted(await claim_all(kube, namespace, "v6", 3)) == ["fd00:10::2", "fd00:10::3", "fd00:10::4"]
    await pool_status(kube, namespace, "v6", {"total": 2**63 - 1, "used": 3, "free": 2**63 - 1, "outOfRange": 0})


async def test_status_counts_and_out_of_range_after_the_pool_shrinks(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("shrinking", ["10.34.0.10-10.34.0.19"], 24), namespace)
    await claim_all(kube, namespace, "shrinking", 4)
    await pool_status(kube, namespace, "shrinking", {"total": 10, "used": 4, "free": 6, "outOfRange": 0})
    await kube.patch(POOLS, "shrinking", {"spec": {"addresses": ["10.34.0.12-10.34.0.19"]}}, namespace)
    status = await pool_status(kube, namespace, "shrinking", {"total": 8, "used": 4, "free": 6, "outOfRange": 2})
    ready = ready_condition(status)
    assert ready is not None and ready["status"] == "True" and "outside" in ready["message"]
    # New claims never get an address still held outside or inside the new range.
    held = await claim_all(kube, namespace, "shrinking", 1, kind="InClusterIPPool")
    assert held == ["10.34.0.14"]


async def test_schema_refuses_invalid_pools_with_the_go_messages(kube: KubeClient, namespace: str) -> None:
    cases = {
        "provided address is not a valid IP, range, nor CIDR": pool("bad", ["10.0.0.1-"], 24),
        "provided addresses are of mixed IP families": pool("bad", ["10.0.0.1", "fd00::1"], 24),
        "provided gateway and addresses are of mixed IP families": pool("bad", ["10.0.0.1"], 24, gateway="fd00::1"),
        "addresses and excluded addresses are of mixed IP families": pool(
            "bad", ["10.0.0.1"], 24, excludedAddresses=["fd00::1"]
        ),
        "provided prefix is not valid": pool("bad", ["10.0.0.1"], 33),
        "addresses is required": pool("bad", [], 24),
    }
    for message, body in cases.items():
        with pytest.raises(ApiError) as refused:
            await kube.create(POOLS, body, namespace)
        assert refused.value.status == 422 and message in refused.value.message, refused.value.message


async def test_a_pool_invalid_beyond_the_schema_is_not_ready_and_its_claims_say_why(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    # Passes the schema, but 10.36.1.5 lies outside 10.35.0.0/24: only the controller can tell.
    await kube.create(POOLS, pool("split", ["10.35.0.0/24", "10.36.1.5"], 24), namespace)
    await kube.create(CLAIMS, claim("on-split", "split"), namespace)
    waiting = await wait_claim_reason(kube, namespace, "on-split", "PoolNotReady")
    condition = ready_condition(waiting)
    assert (
        condition is not None and "provided address belongs to a different subnet than others" in condition["message"]
    )

    async def pool_not_ready() -> dict[str, Any] | None:
        obj = await kube.get(POOLS, "split", namespace)
        ready = ready_condition(obj)
        return obj if ready and ready["status"] == "False" and ready["reason"] == "InvalidConfiguration" else None

    await wait_for(pool_not_ready, message="the pool to be Ready=False/InvalidConfiguration")
    await kube.patch(POOLS, "split", {"spec": {"addresses": ["10.35.0.0/24"]}}, namespace)
    await wait_address(kube, namespace, "on-split", timeout=40)


async def test_a_pool_in_use_is_protected_from_deletion(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("protected", ["10.37.0.0/28"], 28), namespace)
    await kube.create(CLAIMS, claim("user", "protected"), namespace)
    await wait_address(kube, namespace, "user")
    current = await kube.get(POOLS, "protected", namespace)
    assert current is not None and FINALIZER_PROTECT_POOL in current["metadata"]["finalizers"]
    await kube.delete(POOLS, "protected", namespace)

    async def blocked() -> dict[str, Any] | None:
        obj = await kube.get(POOLS, "protected", namespace)
        ready = ready_condition(obj)
        return obj if ready and ready["reason"] == "Deleting" else None

    deleting = await wait_for(blocked, message="the pool deletion to be blocked with a reason")
    assert "Cannot delete Pool until all IPAddresses have been removed" in (ready_condition(deleting) or {})["message"]
    await asyncio.sleep(1)
    assert await kube.get(POOLS, "protected", namespace) is not None
    # Only new allocations wait: a claim whose IPAddress exists stays fulfilled while its pool is deleted.
    await kube.create(CLAIMS, claim("late", "protected"), namespace)
    late = ready_condition(await wait_claim_reason(kube, namespace, "late", "PoolNotReady"))
    assert late is not None and "is being deleted" in late["message"]
    user = ready_condition(await kube.get(CLAIMS, "user", namespace))
    assert user is not None and (user["status"], user["reason"]) == ("True", "AddressAllocated"), user
    await kube.delete(CLAIMS, "user", namespace)

    async def gone() -> bool:
        return await kube.get(POOLS, "protected", namespace) is None

    await wait_for(gone, message="the pool to go once its last IPAddress is gone")


async def test_the_skip_annotation_lets_a_pool_in_use_go(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    body = pool("moving", ["10.38.0.0/28"], 28)
    body["metadata"]["annotations"] = {ANNOTATION_SKIP_DELETE_VALIDATION: ""}
    await kube.create(POOLS, body, namespace)
    await kube.create(CLAIMS, claim("moved", "moving"), namespace)
    await wait_address(kube, namespace, "moved")
    await kube.delete(POOLS, "moving", namespace)

    async def gone() -> bool:
        return await kube.get(POOLS, "moving", namespace) is None

    await wait_for(gone, message="the annotated pool to be deleted although in use")
    await kube.create(CLAIMS, claim("after", "moving"), namespace)
    await wait_claim_reason(kube, namespace, "after", "PoolNotReady")
    moved = ready_condition(await kube.get(CLAIMS, "moved", namespace))
    assert moved is not None and (moved["status"], moved["reason"]) == ("True", "AddressAllocated"), moved
    # The claim can still be released without its pool.
    await kube.delete(CLAIMS, "moved", namespace)

    async def released() -> bool:
        return (
            await kube.get(CLAIMS, "moved", namespace) is None and await kube.get(ADDRESSES, "moved", namespace) is None
        )

    await wait_for(released, message="the claim to be released after its pool is gone")
