"""The first repair pass after a burst of pools, against the real API server: it gives every new pool its
`AddressesRecorded` condition, and a pool created while it does so has its status counted before that pass is done,
behind a few of the burst's status writes, not all of them (docs/performance.md, "one more pool")."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ipam_provider.api.capi import CLAIMS
from ipam_provider.common import Object
from ipam_provider.controller import Controller
from ipam_provider.repair import RepairSettings
from ipam_provider.repair.pool import ADDRESSES_RECORDED
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import POOLS, claim, pool

POOL_COUNT = 64
IN_FLIGHT = 20


@dataclass(frozen=True)
class StatusWrite:
    pool: str
    recorded: bool  # carries the AddressesRecorded condition
    used: int | None
    pass_done: bool  # the repair pass had ended when this write was made


def record_status_writes(controller: Controller, passing: list[asyncio.Task[None]]) -> list[StatusWrite]:
    """Every pool status the controller writes from now on, in order (`passing`: the pass, once started)."""
    writes: list[StatusWrite] = []
    write = controller.context.write_status

    async def recorded(store: Store, resource: Resource, obj: Object, status: Object) -> Object | None:
        answer = await write(store, resource, obj, status)
        types = {condition["type"] for condition in status.get("conditions") or []}
        used = (status.get("ipAddresses") or {}).get("used")
        done = bool(passing) and passing[0].done()
        writes.append(StatusWrite(obj["metadata"]["name"], ADDRESSES_RECORDED in types, used, done))
        return answer

    controller.context.write_status = recorded  # type: ignore[method-assign]
    return writes


async def create_pool_with_claim(kube: KubeClient, namespace: str, index: int, semaphore: asyncio.Semaphore) -> None:
    async with semaphore:
        await kube.create(POOLS, pool(f"p-{index}", [f"10.160.{index}.0/24"], 24), namespace)
        await kube.create(CLAIMS, claim(f"c-{index}", f"p-{index}"), namespace)


async def all_counted(kube: KubeClient, namespace: str, names: set[str]) -> bool:
    items, _ = await kube.list(POOLS, namespace)
    used = {
        item["metadata"]["name"]: ((item.get("status") or {}).get("ipAddresses") or {}).get("used") for item in items
    }
    return all(used.get(name) == 1 for name in names)


async def test_a_pool_created_during_the_first_pass_after_a_burst_is_counted_before_the_pass_ends(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    async with controller_factory(namespaces=[namespace], repair=RepairSettings(interval=0)) as controller:
        semaphore = asyncio.Semaphore(IN_FLIGHT)
        await asyncio.gather(*(create_pool_with_claim(kube, namespace, i, semaphore) for i in range(POOL_COUNT)))
        burst = {f"p-{index}" for index in range(POOL_COUNT)}
        await wait_for(lambda: all_counted(kube, namespace, burst), timeout=240, interval=1.0, message="the burst")

        passing: list[asyncio.Task[None]] = []
        writes = record_status_writes(controller, passing)
        passing.append(asyncio.create_task(controller.repair.run_pass()))  # the loop is off: this is the first

        async def pass_has_written() -> bool:
            return any(write.recorded for write in writes)

        await wait_for(pass_has_written, timeout=60, message="the pass's first condition written")
        await create_pool_with_claim(kube, namespace, POOL_COUNT, asyncio.Semaphore(1))
        fresh = f"p-{POOL_COUNT}"
        await wait_for(lambda: all_counted(kube, namespace, {fresh}), timeout=60, message="the fresh pool counted")
        await asyncio.wait_for(passing[0], timeout=240)

        async def burst_recorded() -> bool:  # the last slice handed over is written after the pass
            return {write.pool for write in writes if write.recorded} >= burst

        await wait_for(burst_recorded, timeout=60, message="every pool of the burst to get its condition")

    counted = next(number for number, w in enumerate(writes) if w.pool == fresh and w.used == 1)
    recorded_before = {w.pool for w in writes[:counted] if w.recorded and w.pool in burst}
    assert not writes[counted].pass_done, "the fresh pool's status waited for the whole pass"
    assert len(recorded_before) <= POOL_COUNT // 2, (
        f"the fresh pool's status was counted after {len(recorded_before)} of the burst's {POOL_COUNT} status writes"
    )
