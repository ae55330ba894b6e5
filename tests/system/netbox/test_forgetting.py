"""The controller with the NetBox backend forgets what it kept for pools and claims that are gone: after cycles of
NetboxIPPools and GlobalNetboxIPPools (new names each cycle) on the real NetBox, with dynamic and requested
addresses, a pool naming a prefix NetBox lacks (with a claim), one whose Secret's token NetBox refuses and one whose
Secret is missing, every path of the controller's `footprint` (tests/support/footprint.py) is back at most at its
size after a warm-up cycle; likewise when the pools stay and only claims churn. In the pool churn the repair loop
runs meanwhile (every 0.5 s), so its calls for pools that are going are part of it. With a cleanup of the backend
made a no-op, the same churn leaves its path grown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from backends.netbox import reasons
from backends.netbox.ledger import Ledger
from backends.netbox.resolver import Resolver
from ipam_provider.api.capi import ADDRESSES, CLAIMS, REASON_POOL_NOT_READY
from ipam_provider.backend.contract import REQUESTED_ADDRESS_ANNOTATION
from ipam_provider.controller import Controller
from ipam_provider.repair import RepairSettings
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.footprint import footprint, footprint_growth, settled
from tests.support.netbox_backend import (
    GLOBAL_NB_POOLS,
    NB_POOLS,
    create_secret,
    global_netbox_pool,
    lend_secrets,
    nb_claim,
    netbox_pool,
    prefix,
    wait_pool_reason,
)
from tests.support.objects import claim, wait_address, wait_claim_reason

if TYPE_CHECKING:
    from tests.support.netbox import NetBoxServer

Object = dict[str, Any]
PREFIX = "10.43.0.0/26"
ABSENT_PREFIX = "10.43.9.0/28"  # not in NetBox
REPAIR = RepairSettings(interval=0.5, grace_period=30.0)


@dataclass
class Churn:
    """Cycles of NetBox pools and claims in one namespace, with new names each cycle."""

    kube: KubeClient
    namespace: str
    controller: Controller
    cycle: int = 0
    pools: list[tuple[Resource, str, str | None]] = field(default_factory=list)  # resource, name, namespace

    async def create(self, resource: Resource, body: Object) -> str:
        scope = self.namespace if resource.namespaced else None
        await self.kube.create(resource, body, scope)
        self.pools.append((resource, body["metadata"]["name"], scope))
        return str(body["metadata"]["name"])

    async def create_pools(self) -> None:
        self.cycle += 1
        self.pools = []
        n = self.cycle
        await self.create(NB_POOLS, netbox_pool(f"ok{n}", [prefix(PREFIX)]))
        await self.create(NB_POOLS, netbox_pool(f"absent{n}", [prefix(ABSENT_PREFIX)]))
        await self.create(NB_POOLS, netbox_pool(f"refused{n}", [prefix(PREFIX)], secret="wrong-token"))
        await self.create(NB_POOLS, netbox_pool(f"nosecret{n}", [prefix(PREFIX)], secret=f"missing-{n}"))
        shared = global_netbox_pool(f"{self.namespace}-g{n}", [prefix(PREFIX)], "netbox", self.namespace)
        await self.create(GLOBAL_NB_POOLS, shared)

    async def churn_claims(self, tag: str) -> None:
        """Two claims in each ready pool (one of the namespaced pool's asking for an address), one in the pool of
        the absent prefix; the pools of a refused token or a missing Secret are reported (their claims' releases
        would wait for NetBox to be usable). Then the claims are deleted."""
        ok, absent, refused, nosecret, shared = (name for _, name, _ in self.pools)
        served: list[tuple[str, str, str, str | None]] = [
            (f"c{tag}-ok-0", ok, NB_POOLS.kind, None),
            (f"c{tag}-ok-asked", ok, NB_POOLS.kind, f"10.43.0.{10 + self.cycle}"),
            *((f"c{tag}-g-{index}", shared, GLOBAL_NB_POOLS.kind, None) for index in range(2)),
        ]
        for name, pool, kind, asked in served:
            annotations = {REQUESTED_ADDRESS_ANNOTATION: asked} if asked else None
            await self.kube.create(CLAIMS, claim(name, pool, kind=kind, annotations=annotations), self.namespace)
        await self.kube.create(CLAIMS, nb_claim(f"c{tag}-absent", absent), self.namespace)
        for name, _, _, _ in served:
            await wait_address(self.kube, self.namespace, name, timeout=60)
        await wait_claim_reason(self.kube, self.namespace, f"c{tag}-absent", REASON_POOL_NOT_READY, timeout=60)
        await wait_pool_reason(self.kube, self.namespace, refused, reasons.AUTH_FAILED)
        await wait_pool_reason(self.kube, self.namespace, nosecret, reasons.SECRET_NOT_FOUND)
        for name in [*(name for name, _, _, _ in served), f"c{tag}-absent"]:
            await self.kube.delete(CLAIMS, name, self.namespace)
        await self.wait_empty(CLAIMS, self.namespace)
        await self.wait_empty(ADDRESSES, self.namespace)

    async def delete_pools(self) -> None:
        for resource, name, scope in self.pools:
            await self.kube.delete(resource, name, scope)
        for resource, name, scope in self.pools:

            async def gone(resource: Resource = resource, name: str = name, scope: str | None = scope) -> bool:
                return await self.kube.get(resource, name, scope) is None

            await wait_for(gone, timeout=60, message=f"{resource.kind} {name} to be gone")

    async def wait_empty(self, resource: Resource, namespace: str) -> None:
        async def empty() -> bool:
            items, _ = await self.kube.list(resource, namespace)
            return not items

        await wait_for(empty, timeout=60, message=f"no {resource.kind} left in {namespace}")

    async def pool_cycle(self) -> None:
        await self.create_pools()
        await self.churn_claims(str(self.cycle))
        await self.delete_pools()
        await self.settle()

    async def settle(self) -> None:
        """Wait until nothing is queued, processed or waiting to be written for QUIET seconds."""
        await settled(self.controller)


Start = Callable[..., Any]


async def prepared(kube: KubeClient, namespace: str, netbox: NetBoxServer) -> None:
    """The prefix, the pools' Secret (lent to the cluster-scoped pools) and one with a token NetBox refuses."""
    if not list(netbox.api().ipam.prefixes.filter(prefix=PREFIX)):  # the module's tests share one database
        netbox.create_prefix(PREFIX)
    await create_secret(kube, namespace, netbox)
    await create_secret(kube, namespace, netbox, name="wrong-token", token="0" * 40)
    await lend_secrets(kube, namespace)


async def churn_growth(kube: KubeClient, namespace: str, start: Start, cycles: int) -> dict[str, tuple[int, int]]:
    async with start(repair=REPAIR) as controller:
        churn = Churn(kube, namespace, controller)
        await churn.pool_cycle()  # warm-up: lazily made state (metric children, clients) exists from here
        before = footprint(controller)
        for _ in range(cycles):
            await churn.pool_cycle()
        return footprint_growth(before, footprint(controller))


async def test_pool_churn_leaves_nothing_behind(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Start
) -> None:
    await prepared(kube, namespace, netbox)
    assert await churn_growth(kube, namespace, netbox_controller, cycles=3) == {}


async def test_claim_churn_in_pools_that_stay_leaves_nothing_behind(
    kube: KubeClient, namespace: str, netbox: NetBoxServer, netbox_controller: Start
) -> None:
    await prepared(kube, namespace, netbox)
    # Without the repair loop: its passes may suspect the holding of a claim being released (a Normal Event per
    # claim, kept in the live pool's Event group up to the correlator's bound), which is the repair loop's to fix.
    async with netbox_controller(repair=RepairSettings(interval=0)) as controller:
        churn = Churn(kube, namespace, controller)
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
        (Resolver, "Controller.registry._backends[*].resolver.known"),
        (Ledger, "Controller.registry._backends[*].ledger._indexes"),
    ],
    ids=["Resolver.forget", "Ledger.forget"],
)
async def test_a_cleanup_made_a_no_op_leaves_its_state_grown(
    kube: KubeClient,
    namespace: str,
    netbox: NetBoxServer,
    netbox_controller: Start,
    monkeypatch: pytest.MonkeyPatch,
    owner: type,
    path: str,
) -> None:
    monkeypatch.setattr(owner, "forget", lambda self, ref: None)
    await prepared(kube, namespace, netbox)
    growth = await churn_growth(kube, namespace, netbox_controller, cycles=1)
    assert any(grown_path.startswith(path) for grown_path in growth), growth
