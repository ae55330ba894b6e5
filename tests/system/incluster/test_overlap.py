"""Overlapping in-cluster pools against the real API server: the AddressesOverlap condition and its Warning Event on
both pools, cleared when one stops overlapping or goes; and the shared uniqueness domain, whose pools never hand
out one address twice, also across a restart of the controller."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backends.incluster.naming import LABEL_DOMAIN, RESERVATIONS, domain_hash
from ipam_provider.api.capi import ADDRESSES, ANNOTATION_SKIP_DELETE_VALIDATION, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import EVENTS, Resource
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import GLOBAL_POOLS, POOLS, claim, global_pool, pool, ready_condition, wait_claim_reason

GLOBAL = "GlobalInClusterIPPool"
Object = dict[str, Any]


@contextlib.asynccontextmanager
async def global_pools(kube: KubeClient, *pools: Object) -> AsyncIterator[None]:
    """Create cluster-scoped pools for one test, and delete them afterwards (they outlive its namespace)."""
    for obj in pools:
        await kube.create(GLOBAL_POOLS, obj)
    try:
        yield
    finally:
        for obj in pools:
            await delete_pool(kube, obj["metadata"]["name"])


async def delete_pool(kube: KubeClient, name: str) -> None:
    """Delete a global pool at once, IPAddresses or not."""
    with contextlib.suppress(ApiError):
        await kube.patch(GLOBAL_POOLS, name, {"metadata": {"annotations": {ANNOTATION_SKIP_DELETE_VALIDATION: ""}}})
        await kube.delete(GLOBAL_POOLS, name)


def overlap_of(obj: Object | None) -> Object | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "AddressesOverlap"), None)


async def wait_overlap(
    kube: KubeClient, resource: Resource, name: str, namespace: str | None, status: str, reason: str
) -> Object:
    """Wait until the pool's AddressesOverlap condition has `status` and `reason`; return the pool."""

    async def probe() -> Object | None:
        obj = await kube.get(resource, name, namespace)
        condition = overlap_of(obj)
        return obj if condition is not None and (condition["status"], condition["reason"]) == (status, reason) else None

    return await wait_for(probe, timeout=30, message=f"pool {name}: AddressesOverlap {status}/{reason}")


async def pool_events(kube: KubeClient, name: str, namespace: str = "default") -> list[Object]:
    """The Events about the pool `name` (those of a global pool are in `default`)."""
    items, _ = await kube.list(EVENTS, namespace)
    return [e for e in items if e["involvedObject"]["name"] == name]


async def claim_many(kube: KubeClient, namespace: str, names_and_pools: list[tuple[str, str]], kind: str) -> None:
    semaphore = asyncio.Semaphore(20)

    async def one(name: str, pool_name: str) -> None:
        async with semaphore:
            await kube.create(CLAIMS, claim(name, pool_name, kind=kind), namespace)

    await asyncio.gather(*(one(n, p) for n, p in names_and_pools))


async def fulfilled_addresses(kube: KubeClient, namespace: str, count: int, timeout: float = 120) -> list[Object]:
    """Wait until `count` claims of the namespace are fulfilled; return the namespace's IPAddresses."""

    async def probe() -> list[Object] | None:
        claims, _ = await kube.list(CLAIMS, namespace)
        done = [c for c in claims if (c.get("status") or {}).get("addressRef")]
        if len(done) < count:
            return None
        return (await kube.list(ADDRESSES, namespace))[0]

    return await wait_for(probe, timeout=timeout, message=f"{count} claims fulfilled in {namespace}")


async def wait_counts(kube: KubeClient, resource: Resource, name: str, namespace: str | None, expected: Object) -> None:
    async def probe() -> bool:
        obj = await kube.get(resource, name, namespace)
        return ((obj or {}).get("status") or {}).get("ipAddresses") == expected

    await wait_for(probe, timeout=30, message=f"pool {name} to count {expected}")


def by_pool(addresses: list[Object]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = collections.defaultdict(list)
    for item in addresses:
        found[item["spec"]["poolRef"]["name"]].append(item["spec"]["address"])
    return found


async def test_overlapping_pools_are_flagged_on_both_sides_until_they_stop_overlapping(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    first, second = f"{namespace}-a", f"{namespace}-b"
    async with (
        controller_factory(namespaces=[namespace]),
        global_pools(kube, global_pool(first, ["172.24.0.0/24"], 24), global_pool(second, ["172.24.0.0/24"], 24)),
    ):
        for name, other in ((first, second), (second, first)):
            obj = await wait_overlap(kube, GLOBAL_POOLS, name, None, "True", "PoolsOverlap")
            message = overlap_of(obj)["message"]  # type: ignore[index]
            assert f"{GLOBAL}/{other} (254 addresses, first 172.24.0.1)" in message
            assert "spec.uniquenessDomain" in message
            ready = ready_condition(obj)
            assert ready is not None and ready["status"] == "True", "overlap alone leaves the pool Ready"

            async def warned(name: str = name, other: str = other) -> bool:
                events = await pool_events(kube, name)
                return any(
                    e["type"] == "Warning" and e["reason"] == "PoolsOverlap" and other in e["message"] for e in events
                )

            await wait_for(warned, message=f"a Warning Event on {name} naming {other}")

        # Without a shared domain each pool hands out its lowest free address: the same ones, to different claims.
        await claim_many(kube, namespace, [(f"c-{i}", (first, second)[i % 2]) for i in range(20)], GLOBAL)
        handed_out = [a["spec"]["address"] for a in await fulfilled_addresses(kube, namespace, 20)]
        assert len(set(handed_out)) == 10, "overlapping pools without a domain give one address to two claims"

        # The second pool stops overlapping (a spec change): both clear.
        await kube.patch(GLOBAL_POOLS, second, {"spec": {"addresses": ["172.24.1.0/24"]}})
        for name in (first, second):
            obj = await wait_overlap(kube, GLOBAL_POOLS, name, None, "False", "NoOverlap")
        # ... overlaps again, in part: both see it again, with the shared count.
        await kube.patch(GLOBAL_POOLS, second, {"spec": {"addresses": ["172.24.0.200-172.24.0.254"]}})
        obj = await wait_overlap(kube, GLOBAL_POOLS, first, None, "True", "PoolsOverlap")
        assert f"{GLOBAL}/{second} (55 addresses, first 172.24.0.200)" in overlap_of(obj)["message"]  # type: ignore[index]
        await wait_overlap(kube, GLOBAL_POOLS, second, None, "True", "PoolsOverlap")
        # ... and goes: the first clears.
        await delete_pool(kube, second)
        await wait_overlap(kube, GLOBAL_POOLS, first, None, "False", "NoOverlap")


async def test_a_shared_domain_never_hands_out_one_address_twice_also_after_a_restart(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    first, second, domain = f"{namespace}-a", f"{namespace}-b", f"d-{namespace}"
    pools = [global_pool(name, ["172.25.0.0/24"], 24, uniquenessDomain=domain) for name in (first, second)]
    # Every namespace watched: the pools count the IPAddresses of the other pool of their domain from the cache.
    async with global_pools(kube, *pools):
        async with controller_factory():
            for name, other in ((first, second), (second, first)):
                obj = await wait_overlap(kube, GLOBAL_POOLS, name, None, "True", "OverlapWithinUniquenessDomain")
                message = overlap_of(obj)["message"]  # type: ignore[index]
                assert f"{GLOBAL}/{other}" in message and domain in message
            await claim_many(kube, namespace, [(f"c-{i}", (first, second)[i % 2]) for i in range(100)], GLOBAL)
            addresses = await fulfilled_addresses(kube, namespace, 100)
            assert len({a["spec"]["address"] for a in addresses}) == 100, "no address twice within the domain"
            assert {name: len(values) for name, values in by_pool(addresses).items()} == {first: 50, second: 50}
            for name in (first, second):
                await wait_counts(
                    kube, GLOBAL_POOLS, name, None, {"total": 254, "used": 50, "free": 154, "outOfRange": 0}
                )
            assert not [e for name in (first, second) for e in await pool_events(kube, name) if e["type"] == "Warning"]
        reservations, _ = await kube.list(RESERVATIONS, label_selector=f"{LABEL_DOMAIN}={domain}")
        assert len(reservations) == 100
        assert all(r["metadata"]["name"].startswith(f"{domain_hash(domain)}.") for r in reservations)

        # A new process learns what the domain holds from the reservations listed by the domain's label.
        async with controller_factory():
            await claim_many(kube, namespace, [(f"d-{i}", (first, second)[i % 2]) for i in range(20)], GLOBAL)
            addresses = await fulfilled_addresses(kube, namespace, 120)
            assert len({a["spec"]["address"] for a in addresses}) == 120, "no address twice after a restart"
            for name in (first, second):
                await wait_counts(
                    kube, GLOBAL_POOLS, name, None, {"total": 254, "used": 60, "free": 134, "outOfRange": 0}
                )
            for i in range(120):  # released while the controller runs, so that the namespace can go
                await kube.delete(CLAIMS, f"{'c' if i < 100 else 'd'}-{i % 100}", namespace)


async def test_a_namespaced_and_a_global_pool_share_a_domain_to_exhaustion(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    shared, domain = f"{namespace}-g", f"e-{namespace}"
    await kube.create(POOLS, pool("local", ["172.26.0.0/28"], 28, uniquenessDomain=domain), namespace)
    async with (
        global_pools(kube, global_pool(shared, ["172.26.0.0/28"], 28, uniquenessDomain=domain)),
        controller_factory(),
    ):
        await wait_overlap(kube, POOLS, "local", namespace, "True", "OverlapWithinUniquenessDomain")
        for i in range(7):
            await kube.create(CLAIMS, claim(f"l-{i}", "local"), namespace)
            await kube.create(CLAIMS, claim(f"g-{i}", shared, kind=GLOBAL), namespace)
        addresses = await fulfilled_addresses(kube, namespace, 14)
        assert len({a["spec"]["address"] for a in addresses}) == 14, "the 14 addresses of the /28, each once"
        await wait_counts(kube, POOLS, "local", namespace, {"total": 14, "used": 7, "free": 0, "outOfRange": 0})
        await kube.create(CLAIMS, claim("one-more", "local"), namespace)
        await wait_claim_reason(kube, namespace, "one-more", "PoolExhausted")
        for name in ["one-more", *(f"{p}-{i}" for p in "lg" for i in range(7))]:
            await kube.delete(CLAIMS, name, namespace)


@pytest.mark.parametrize(
    ("before", "after"),
    [("one", "two"), ("one", None), (None, "one")],
    ids=["changed", "removed", "added"],
)
async def test_the_uniqueness_domain_cannot_change(
    kube: KubeClient, namespace: str, before: str | None, after: str | None
) -> None:
    spec = {"uniquenessDomain": before} if before else {}
    await kube.create(POOLS, pool("fixed", ["172.27.0.0/28"], 28, **spec), namespace)
    with pytest.raises(ApiError) as refused:
        await kube.patch(POOLS, "fixed", {"spec": {"uniquenessDomain": after}}, namespace)
    assert "uniquenessDomain cannot change" in str(refused.value)


async def test_a_uniqueness_domain_is_a_dns_label(kube: KubeClient, namespace: str) -> None:
    with pytest.raises(ApiError) as refused:
        await kube.create(POOLS, pool("bad", ["172.27.1.0/28"], 28, uniquenessDomain="Not_A_Label"), namespace)
    assert "uniquenessDomain" in str(refused.value)
