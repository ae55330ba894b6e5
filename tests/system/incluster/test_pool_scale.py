"""Many in-cluster pools against the real API server: a new pool makes only the pools it overlaps report again,
whatever the number of pools (a pool's change never re-reports every pool)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ipam_provider.backend.contract import PoolRef
from ipam_provider.controller import Controller
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import POOLS, pool

POOL_COUNT = 300
OTHERS_AT_MOST = 2  # the one more pool overlaps exactly two of the others


def subnet(index: int) -> str:
    return f"10.{140 + index // 256}.{index % 256}.0/24"


def recording(controller: Controller, namespace: str) -> list[PoolRef]:
    """Every reconcile of a pool in `namespace` by the controller from now on, in order. Cluster-scoped pools that
    other tests left on the shared API server are reconciled too, on their own schedule, and are not counted."""
    seen: list[PoolRef] = []
    reconcile: Callable[[PoolRef], Awaitable[float | None]] = controller.pools.reconcile

    async def recorded(ref: PoolRef) -> float | None:
        if ref.namespace == namespace:
            seen.append(ref)
        return await reconcile(ref)

    controller.pools.reconcile = recorded  # type: ignore[method-assign]
    return seen


async def quiet(seen: list[PoolRef], for_seconds: float = 2.0) -> None:
    """Wait until no pool has been reconciled for `for_seconds`."""
    count, since = len(seen), time.monotonic()

    async def settled() -> bool:
        nonlocal count, since
        if len(seen) != count:
            count, since = len(seen), time.monotonic()
        return time.monotonic() - since >= for_seconds

    await wait_for(settled, timeout=120, message="the pools' reconciles to settle")


async def reported(kube: KubeClient, namespace: str, names: set[str], reason: str) -> None:
    """Wait until each named pool's AddressesOverlap condition has `reason`."""

    async def probe() -> bool:
        items, _ = await kube.list(POOLS, namespace)
        conditions = {
            item["metadata"]["name"]: {c["type"]: c["reason"] for c in (item.get("status") or {}).get("conditions", [])}
            for item in items
        }
        return all(conditions.get(name, {}).get("AddressesOverlap") == reason for name in names)

    await wait_for(probe, timeout=180, interval=1.0, message=f"pools {sorted(names)[:3]}... to report {reason}")


async def test_one_more_pool_makes_only_the_pools_it_overlaps_report_again(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    async with controller_factory(namespaces=[namespace], repair=RepairSettings(interval=0)) as controller:
        seen = recording(controller, namespace)
        semaphore = asyncio.Semaphore(20)

        async def create(name: str, addresses: list[str], prefix: int = 24) -> None:
            async with semaphore:
                await kube.create(POOLS, pool(name, addresses, prefix), namespace)

        await asyncio.gather(*(create(f"p-{index}", [subnet(index)]) for index in range(POOL_COUNT)))
        await reported(kube, namespace, {f"p-{index}" for index in range(POOL_COUNT)}, "NoOverlap")
        await quiet(seen)

        before = len(seen)
        await create("disjoint", [subnet(POOL_COUNT)])
        await reported(kube, namespace, {"disjoint"}, "NoOverlap")
        await quiet(seen)
        others = {ref.name for ref in seen[before:]} - {"disjoint"}
        assert others == set(), f"a pool overlapping none made {len(others)} others report again"

        before = len(seen)
        await create("one-more", ["10.140.0.200-10.140.1.20"], 23)  # the end of p-0 and the start of p-1
        await reported(kube, namespace, {"one-more", "p-0", "p-1"}, "PoolsOverlap")
        await quiet(seen)
        others = {ref.name for ref in seen[before:]} - {"one-more"}
        assert others == {"p-0", "p-1"} and len(others) <= OTHERS_AT_MOST, (
            f"one more pool made {len(others)} of {POOL_COUNT + 1} other pools report again"
        )
