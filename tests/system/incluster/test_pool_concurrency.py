"""Many claims on one pool with many workers: 500 claims on a single InClusterIPPool, 16 workers. Every claim is
fulfilled, no address is handed out twice, there is exactly one reservation per claim, and once the claims are
deleted no reservation or IPAddress is left behind (no leak)."""

from __future__ import annotations

import asyncio

from backends.incluster.naming import RESERVATIONS
from ipam_provider.api.capi import ADDRESSES, CLAIMS
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.objects import POOLS, pool
from tests.system.incluster.test_no_duplicates import assert_unique_and_complete, create_claims

CLAIM_COUNT = 500


async def test_500_claims_on_one_pool_with_16_workers(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    await kube.create(POOLS, pool("one", ["10.44.0.0/23"], 23), namespace)
    async with controller_factory(namespaces=[namespace], workers=16):
        await create_claims(kube, namespace, [(f"c-{i}", "one") for i in range(CLAIM_COUNT)])
        by_pool = await assert_unique_and_complete(kube, namespace, CLAIM_COUNT, timeout=300)  # a bound, not a goal
        assert len(by_pool["one"]) == CLAIM_COUNT

        semaphore = asyncio.Semaphore(20)

        async def delete(name: str) -> None:
            async with semaphore:
                await kube.delete(CLAIMS, name, namespace)

        await asyncio.gather(*(delete(f"c-{i}") for i in range(CLAIM_COUNT)))

        async def nothing_left() -> bool:
            reservations, _ = await kube.list(RESERVATIONS)
            mine = [r for r in reservations if r["spec"]["claim"].get("namespace") == namespace]
            claims, _ = await kube.list(CLAIMS, namespace)
            addresses, _ = await kube.list(ADDRESSES, namespace)
            left.update(reservations=len(mine), claims=len(claims), addresses=len(addresses))
            return not (mine or claims or addresses)

        left: dict[str, int] = {}
        await wait_for(nothing_left, timeout=300, message=lambda: f"every claim released; left: {left}")
