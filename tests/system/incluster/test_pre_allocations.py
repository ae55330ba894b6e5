"""`spec.preAllocations` of in-cluster pools, against the real API server: a pre-allocated address is never handed
to another claim, even before the named claim exists, and the named claim gets exactly it; wrong entries make the
pool Ready=False with a message saying which, while the valid ones keep serving."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.controller import Controller
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.objects import (
    GLOBAL_POOLS,
    POOLS,
    Object,
    claim,
    global_pool,
    pool,
    ready_condition,
    wait_address,
    wait_claim_reason,
)


async def wait_pool(
    kube: KubeClient, resource: Resource, name: str, namespace: str | None, check: Callable[[Object], bool]
) -> Object:
    """Wait until the pool's status passes `check`; return the pool."""

    async def probe() -> Object | None:
        found = await kube.get(resource, name, namespace)
        return found if found is not None and check(found) else None

    return await wait_for(probe, message=f"pool {name} to reach the expected status")


def ready_is(status: str, reason: str, *parts: str) -> Callable[[Object], bool]:
    def check(obj: Object) -> bool:
        condition = ready_condition(obj) or {}
        message = str(condition.get("message", ""))
        return (
            condition.get("status") == status and condition.get("reason") == reason and all(p in message for p in parts)
        )

    return check


def counts_are(**expected: int) -> Callable[[Object], bool]:
    def check(obj: Object) -> bool:
        counts: dict[str, Any] = (obj.get("status") or {}).get("ipAddresses") or {}
        return all(counts.get(k) == v for k, v in expected.items())

    return check


async def failure_message(kube: KubeClient, namespace: str, name: str) -> str:
    failed = await wait_claim_reason(kube, namespace, name, "AllocationFailed")
    assert await kube.get(ADDRESSES, name, namespace) is None, f"{name} must get no IPAddress"
    return str((ready_condition(failed) or {}).get("message"))


async def test_a_pre_allocated_address_waits_for_its_claim_while_the_pool_fills_up(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    # The pinned address is the lowest: dynamic allocation would take it first.
    spec = {"preAllocations": {"named": "10.70.0.10"}}
    await kube.create(POOLS, pool("net", ["10.70.0.10-10.70.0.13"], 24, **spec), namespace)
    for name in ("d1", "d2", "d3"):
        await kube.create(CLAIMS, claim(name, "net"), namespace)
    dynamic = {(await wait_address(kube, namespace, n))["spec"]["address"] for n in ("d1", "d2", "d3")}
    assert dynamic == {"10.70.0.11", "10.70.0.12", "10.70.0.13"}
    await kube.create(CLAIMS, claim("d4", "net"), namespace)
    exhausted = await wait_claim_reason(kube, namespace, "d4", "PoolExhausted")
    message = str((ready_condition(exhausted) or {}).get("message"))
    assert "no free address for this claim" in message and "1 are pre-allocated to named claims" in message
    full = await wait_pool(kube, POOLS, "net", namespace, counts_are(total=4, used=3, free=0))
    assert ready_is("True", "PoolReady", "0 of 4 addresses free", "1 more pre-allocated")(full), full["status"]
    # Requested by another claim: refused as not the pool's to give.
    await kube.create(CLAIMS, claim("asks", "net", annotations={REQUESTED_ADDRESS_ANNOTATION: "10.70.0.10"}), namespace)
    refused = await failure_message(kube, namespace, "asks")
    assert refused.startswith(f"requested address 10.70.0.10 is outside InClusterIPPool/{namespace}/net (")
    assert "pre-allocated to claim named" in refused
    # The named claim, created last, gets exactly its address.
    await kube.create(CLAIMS, claim("named", "net"), namespace)
    assert (await wait_address(kube, namespace, "named"))["spec"]["address"] == "10.70.0.10"
    served = await wait_pool(kube, POOLS, "net", namespace, counts_are(total=4, used=4, free=0))
    assert ready_is("True", "PoolReady", "0 of 4 addresses free")(served)
    assert "pre-allocated" not in str((ready_condition(served) or {}).get("message"))
    d4 = ready_condition(await kube.get(CLAIMS, "d4", namespace))
    assert d4 is not None and d4["reason"] == "PoolExhausted"


async def test_a_global_pool_names_claims_as_namespace_slash_name(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    name = f"{namespace}-v6"
    spec = {"preAllocations": {f"{namespace}/node": "fd00:70::1", "node": "fd00:70::2"}}
    await kube.create(GLOBAL_POOLS, global_pool(name, ["fd00:70::1-fd00:70::3"], 64, **spec), None)
    try:
        await kube.create(CLAIMS, claim("node", name, kind="GlobalInClusterIPPool"), namespace)
        await kube.create(CLAIMS, claim("other", name, kind="GlobalInClusterIPPool"), namespace)
        assert (await wait_address(kube, namespace, "node"))["spec"]["address"] == "fd00:70::1"
        # fd00:70::2 stays pinned (to a key that names no claim of a global pool): the other claim gets ::3.
        assert (await wait_address(kube, namespace, "other"))["spec"]["address"] == "fd00:70::3"
        check = ready_is("False", "InvalidConfiguration", "preAllocations[node]", "namespace/name")
        await wait_pool(kube, GLOBAL_POOLS, name, None, check)
    finally:
        for claim_name in ("node", "other"):
            await kube.delete(CLAIMS, claim_name, namespace)

        async def released() -> bool:
            return all([await kube.get(CLAIMS, n, namespace) is None for n in ("node", "other")])

        await wait_for(released, message="the claims to be released")
        await kube.delete(GLOBAL_POOLS, name, None)


async def test_wrong_entries_make_the_pool_not_ready_while_the_valid_ones_serve(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    entries = {"far": "10.71.0.200", "b": "10.71.0.12", "c": "10.71.0.12", "d": "10.71.0.13", "e": "10.71.0.11"}
    await kube.create(POOLS, pool("net", ["10.71.0.10-10.71.0.20"], 24, preAllocations=entries), namespace)
    problems = (
        "preAllocations[far]: 10.71.0.200 is not an allocatable address of the pool",
        "10.71.0.12 is pre-allocated to more than one claim: b, c",
    )
    invalid = await wait_pool(kube, POOLS, "net", namespace, ready_is("False", "InvalidConfiguration", *problems))
    assert str((ready_condition(invalid) or {}).get("message")).endswith("fix spec.preAllocations")
    await kube.create(CLAIMS, claim("d", "net"), namespace)
    await kube.create(CLAIMS, claim("dynamic", "net"), namespace)
    assert (await wait_address(kube, namespace, "d"))["spec"]["address"] == "10.71.0.13"
    assert (await wait_address(kube, namespace, "dynamic"))["spec"]["address"] == "10.71.0.10"
    await kube.create(CLAIMS, claim("dynamic-2", "net"), namespace)  # .11, .12 and .13 stay pinned
    assert (await wait_address(kube, namespace, "dynamic-2"))["spec"]["address"] == "10.71.0.14"
    await kube.create(CLAIMS, claim("far", "net"), namespace)
    assert "preAllocations[far]: 10.71.0.200 is not an allocatable address" in await failure_message(
        kube, namespace, "far"
    )
    await kube.create(CLAIMS, claim("b", "net"), namespace)
    assert "pre-allocates 10.71.0.12 to more than one claim (b, c)" in await failure_message(kube, namespace, "b")
    conflicting = claim("e", "net", annotations={REQUESTED_ADDRESS_ANNOTATION: "10.71.0.19"})
    await kube.create(CLAIMS, conflicting, namespace)
    assert "pre-allocates 10.71.0.11 to it" in await failure_message(kube, namespace, "e")
    # A value that is no IP address is refused by the API server itself.
    with pytest.raises(ApiError) as refused:
        await kube.create(POOLS, pool("typo", ["10.71.1.0/24"], 24, preAllocations={"x": "10.71.1.300"}), namespace)
    assert "preAllocations: the address is not a valid IP address" in str(refused.value)


async def test_a_pre_allocated_address_held_by_another_claim_makes_the_pool_not_ready(
    kube: KubeClient, namespace: str, in_process_controller: Controller
) -> None:
    await kube.create(POOLS, pool("net", ["10.72.0.10-10.72.0.20"], 24), namespace)
    await kube.create(CLAIMS, claim("squatter", "net"), namespace)
    assert (await wait_address(kube, namespace, "squatter"))["spec"]["address"] == "10.72.0.10"
    await kube.patch(POOLS, "net", {"spec": {"preAllocations": {"named": "10.72.0.10"}}}, namespace)
    held = f"preAllocations[named]: 10.72.0.10 is already held by claim {namespace}/squatter"
    await wait_pool(kube, POOLS, "net", namespace, ready_is("False", "InvalidConfiguration", held))
    await kube.create(CLAIMS, claim("named", "net"), namespace)
    message = await failure_message(kube, namespace, "named")
    assert message.startswith(f"pre-allocated address 10.72.0.10 is already held by claim {namespace}/squatter in")
    assert message.endswith("delete that claim or change spec.preAllocations")
    await kube.delete(CLAIMS, "squatter", namespace)
    assert (await wait_address(kube, namespace, "named"))["spec"]["address"] == "10.72.0.10"
    await wait_pool(kube, POOLS, "net", namespace, ready_is("True", "PoolReady"))
