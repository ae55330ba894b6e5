"""The controller with the Infoblox backend forgets what it kept for pools and claims that are gone: after cycles of
InfobloxIPPools (new names each cycle) on the WAPI simulator, with dynamic and requested addresses, a pool of a
missing InfobloxInstance and one of an instance whose credentials are refused, each with claims, every path of the
controller's `footprint` (tests/support/footprint.py) is back at most at its size after a warm-up cycle; likewise
when the pools stay and only claims churn. The repair loop runs meanwhile (every 0.5 s), so its calls for pools
that are going, and its passes racing the claims' releases, are part of it. With a cleanup of the backend made a
no-op, the same churn leaves its path grown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from backends.infoblox.checks import PoolChecks
from backends.infoblox.ledger import Ledger
from ipam_provider.api.capi import ADDRESSES, CLAIMS, REASON_POOL_NOT_READY
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.controller import Controller
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.footprint import footprint, footprint_growth, settled
from tests.support.infoblox import KIND, POOLS, Grid, wait_pool_reason
from tests.support.objects import claim, wait_address, wait_claim_reason

Object = dict[str, Any]
REPAIR = RepairSettings(interval=0.5, grace_period=30.0)


@dataclass
class Churn:
    """Cycles of Infoblox pools and claims in one namespace, with new names each cycle."""

    kube: KubeClient
    namespace: str
    controller: Controller
    grid: Grid
    refused: Grid
    cycle: int = 0
    pools: list[str] = field(default_factory=list)

    async def create_pools(self) -> None:
        self.cycle += 1
        self.pools = [f"ok{self.cycle}", f"other{self.cycle}", f"absent{self.cycle}", f"refused{self.cycle}"]
        subnets = [{"cidr": "10.10.0.0/24"}]
        await self.grid.create_pool(self.pools[0], subnets=subnets)
        await self.grid.create_pool(self.pools[1], subnets=subnets)
        await self.grid.create_pool(self.pools[2], subnets=subnets, instanceRef={"name": f"absent-{self.cycle}"})
        await self.refused.create_pool(self.pools[3], subnets=subnets)

    async def churn_claims(self, tag: str) -> None:
        """Two claims in each ready pool and one asking for an address, one in the pool of the missing instance
        (released as impossible); the refused instance's pool is reported, its claims would wait for the grid's
        re-check to be released. Then the claims are deleted."""
        ok, other, absent, refused = self.pools
        served: list[tuple[str, str, str | None]] = [
            (f"c{tag}-{pool}-{index}", pool, None) for pool in (ok, other) for index in range(2)
        ]
        served.append((f"c{tag}-asked", ok, f"10.10.0.{100 + self.cycle}"))
        for name, pool, asked in served:
            annotations = {REQUESTED_ADDRESS_ANNOTATION: asked} if asked else None
            await self.kube.create(CLAIMS, claim(name, pool, kind=KIND, annotations=annotations), self.namespace)
        await self.kube.create(CLAIMS, claim(f"c{tag}-{absent}", absent, kind=KIND), self.namespace)
        for name, _, _ in served:
            await wait_address(self.kube, self.namespace, name)
        await wait_claim_reason(self.kube, self.namespace, f"c{tag}-{absent}", REASON_POOL_NOT_READY)
        await wait_pool_reason(self.kube, self.namespace, refused, "AuthenticationFailed")
        for name in [*(name for name, _, _ in served), f"c{tag}-{absent}"]:
            await self.kube.delete(CLAIMS, name, self.namespace)
        await self.wait_empty(CLAIMS)
        await self.wait_empty(ADDRESSES)

    async def delete_pools(self) -> None:
        for name in self.pools:
            await self.kube.delete(POOLS, name, self.namespace)
        await self.wait_empty(POOLS)

    async def wait_empty(self, resource: Resource) -> None:
        async def empty() -> bool:
            items, _ = await self.kube.list(resource, self.namespace)
            return not items

        await wait_for(empty, timeout=30, message=f"no {resource.kind} left in {self.namespace}")

    async def pool_cycle(self) -> None:
        await self.create_pools()
        await self.churn_claims(str(self.cycle))
        await self.delete_pools()
        await self.settle()

    async def settle(self) -> None:
        """Wait until nothing is queued, processed or waiting to be written for QUIET seconds."""
        await settled(self.controller)


Start = Callable[..., Any]


async def churn_growth(
    kube: KubeClient, namespace: str, start: Start, grid: Grid, refused: Grid, cycles: int
) -> dict[str, tuple[int, int]]:
    async with start(repair=REPAIR) as controller:
        churn = Churn(kube, namespace, controller, grid, refused)
        await churn.pool_cycle()  # warm-up: lazily made state (metric children, connections) exists from here
        before = footprint(controller)
        for _ in range(cycles):
            await churn.pool_cycle()
        return footprint_growth(before, footprint(controller))


async def test_pool_churn_leaves_nothing_behind(
    kube: KubeClient, namespace: str, infoblox_controller: Start, grid: Grid, grid_factory: Callable[..., Any]
) -> None:
    refused = await grid_factory(password="not-the-password")
    assert await churn_growth(kube, namespace, infoblox_controller, grid, refused, cycles=3) == {}


async def test_claim_churn_in_pools_that_stay_leaves_nothing_behind(
    kube: KubeClient, namespace: str, infoblox_controller: Start, grid: Grid, grid_factory: Callable[..., Any]
) -> None:
    refused = await grid_factory(password="not-the-password")
    async with infoblox_controller(repair=REPAIR) as controller:  # passes race the releases, and keep nothing
        churn = Churn(kube, namespace, controller, grid, refused)
        await churn.create_pools()
        await churn.churn_claims("w")
        await churn.settle()
        before = footprint(controller)
        for cycle in range(3):
            await churn.churn_claims(str(cycle))
            await churn.settle()
        assert footprint_growth(before, footprint(controller)) == {}
        await churn.delete_pools()


@pytest.mark.parametrize(
    ("owner", "path"),
    [
        (Ledger, "Controller.registry._backends[*].ledger.known"),
        (PoolChecks, "Controller.registry._backends[*].checks._results"),
    ],
    ids=["Ledger.forget", "PoolChecks.forget"],
)
async def test_a_cleanup_made_a_no_op_leaves_its_state_grown(
    kube: KubeClient,
    namespace: str,
    infoblox_controller: Start,
    grid: Grid,
    grid_factory: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    owner: type,
    path: str,
) -> None:
    monkeypatch.setattr(owner, "forget", lambda self, ref: None)
    refused = await grid_factory(password="not-the-password")
    growth = await churn_growth(kube, namespace, infoblox_controller, grid, refused, cycles=1)
    assert any(grown_path.startswith(path) for grown_path in growth), growth
