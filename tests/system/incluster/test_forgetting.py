"""The controller forgets what it kept for objects that are gone: after pools and claims of every in-cluster kind
are created and deleted in cycles (new names each cycle; claims of a missing pool and of an unserved kind; two
pools overlapping; Events), every path of its `footprint` (tests/support/footprint.py: any component's containers,
found by walking the object graph, with no registration) is back at most at its size after a warm-up cycle. The
fleet form (pools stay, claims churn) too. The mutation cases prove each cleanup is needed: with one made a no-op,
the same churn leaves the path it cleans grown."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from backends.incluster.backend import InClusterBackend
from backends.incluster.domains import Coverage
from backends.incluster.ledger import Ledger
from backends.incluster.reservations import ReservationClient
from ipam_provider.api.capi import ADDRESSES, CLAIMS, REASON_POOL_NOT_READY
from ipam_provider.cache import patch_cached
from ipam_provider.controller import Controller
from ipam_provider.reconcile import context
from ipam_provider.reconcile.context import ReconcileContext
from ipam_provider.repair import RepairSettings
from ipam_provider.repair.pool import PoolRepairs
from ipam_provider.runtime.cache.store import Store
from ipam_provider.runtime.events.correlator import EventCorrelator
from ipam_provider.runtime.events.recorder import EventRecorder
from ipam_provider.runtime.kube.client import KubeClient
from ipam_provider.runtime.kube.errors import ApiError
from ipam_provider.runtime.kube.resources import Resource
from tests.support.cluster import wait_for
from tests.support.controller import ControllerFactory
from tests.support.footprint import footprint, footprint_growth, settled
from tests.support.objects import (
    GLOBAL_POOLS,
    GLOBAL_PREFIX_POOLS,
    POOLS,
    PREFIX_POOLS,
    claim,
    wait_address,
    wait_claim_reason,
)

pytestmark = pytest.mark.apiserver

Object = dict[str, Any]

REPAIR = RepairSettings(interval=1.0, grace_period=2.0)  # its passes run during the churn, at a test's pace


@dataclass(frozen=True)
class PoolSpec:
    """A pool the churn creates: its resource, a name stem and its spec."""

    resource: Resource
    stem: str
    spec: Object

    def manifest(self, name: str) -> Object:
        return {
            "apiVersion": self.resource.api_version,
            "kind": self.resource.kind,
            "metadata": {"name": name},
            "spec": self.spec,
        }


# a and b overlap (an AddressesOverlap Warning Event each); the same ranges every cycle.
POOL_SPECS = (
    PoolSpec(POOLS, "a", {"addresses": ["10.70.0.0/27"], "prefix": 24}),
    PoolSpec(POOLS, "b", {"addresses": ["10.70.0.16/28"], "prefix": 24}),
    PoolSpec(GLOBAL_POOLS, "g", {"addresses": ["10.71.0.0/27"], "prefix": 24, "uniquenessDomain": "forgetting"}),
    PoolSpec(PREFIX_POOLS, "p", {"prefixes": ["fd00:70::/48"]}),
    PoolSpec(GLOBAL_PREFIX_POOLS, "q", {"prefixes": ["fd00:71::/48"]}),
)


@dataclass
class Churn:
    """Cycles of pools and claims in one namespace, with new names each cycle."""

    kube: KubeClient
    namespace: str
    controller: Controller
    claims_per_pool: int = 2
    same_names: bool = False  # each cycle's pools (and claims) are named as the cycle before's
    cycle: int = 0
    pools: list[tuple[PoolSpec, str]] = field(default_factory=list)

    def scope(self, spec: PoolSpec) -> str | None:
        return self.namespace if spec.resource.namespaced else None

    async def create_pools(self) -> None:
        self.cycle += 1
        self.pools = []
        suffix = "" if self.same_names else str(self.cycle)
        for spec in POOL_SPECS:
            name = f"{spec.stem}{suffix}" if spec.resource.namespaced else f"{self.namespace}-{spec.stem}{suffix}"
            await self.kube.create(spec.resource, spec.manifest(name), self.scope(spec))
            self.pools.append((spec, name))

    async def churn_claims(self, tag: str) -> None:
        """Claims in every pool, one of a missing pool and one of a kind nobody serves; fulfilled, then deleted."""
        names, by_pool = [], {}
        for spec, pool in self.pools:
            for index in range(self.claims_per_pool):
                name = f"c{tag}-{spec.stem}-{index}"
                await self.kube.create(CLAIMS, claim(name, pool, kind=spec.resource.kind), self.namespace)
                names.append(name)
                by_pool[name] = pool
        await self.kube.create(CLAIMS, claim(f"c{tag}-missing", f"missing{tag}"), self.namespace)
        await self.kube.create(CLAIMS, claim(f"c{tag}-alien", "x", kind="NoSuchPool"), self.namespace)
        addresses = {
            (by_pool[name], (await wait_address(self.kube, self.namespace, name))["spec"]["address"]) for name in names
        }
        assert len(addresses) == len(names), f"an address handed out twice in one pool: {sorted(addresses)}"
        await wait_claim_reason(self.kube, self.namespace, f"c{tag}-missing", REASON_POOL_NOT_READY)
        for name in [*names, f"c{tag}-missing", f"c{tag}-alien"]:
            await self.kube.delete(CLAIMS, name, self.namespace)
        await self.wait_empty(CLAIMS, self.namespace)
        await self.wait_empty(ADDRESSES, self.namespace)

    async def delete_pools(self) -> None:
        for spec, name in self.pools:
            await self.kube.delete(spec.resource, name, self.scope(spec))
        for spec, name in self.pools:
            await self.wait_gone(spec.resource, name, self.scope(spec))

    async def remove_cluster_scoped(self) -> None:
        """Delete what the namespace's deletion leaves: the cluster-scoped pools of the last cycle."""
        for spec, name in self.pools:
            if not spec.resource.namespaced:
                with contextlib.suppress(ApiError):
                    await self.kube.delete(spec.resource, name)

    async def wait_gone(self, resource: Resource, name: str, namespace: str | None) -> None:
        async def gone() -> bool:
            return await self.kube.get(resource, name, namespace) is None

        await wait_for(gone, timeout=30, message=f"{resource.kind} {name} to be gone")

    async def wait_empty(self, resource: Resource, namespace: str) -> None:
        async def empty() -> bool:
            items, _ = await self.kube.list(resource, namespace)
            return not items

        await wait_for(empty, timeout=30, message=f"no {resource.kind} left in {namespace}")

    async def pool_cycle(self) -> None:
        await self.create_pools()
        await self.churn_claims("" if self.same_names else str(self.cycle))
        await self.delete_pools()
        await self.settle()

    async def repair_pass(self) -> None:
        """Wait until a repair pass (if it runs) has run from start to end since now."""
        repair, passes = self.controller.repair, self.controller.repair.passes
        if self.controller.settings.repair.enabled:
            await wait_for(lambda: _true(repair.passes >= passes + 2), timeout=30, message="a repair pass")

    async def settle(self) -> None:
        """Wait until a repair pass (if it runs) has run from start to end after the churn, and then until nothing
        is queued, processed or waiting to be written for QUIET seconds."""
        await self.repair_pass()
        await settled(self.controller)


async def _true(value: bool) -> bool:
    return value


def assert_nothing_grew(before: dict[str, int], after: dict[str, int]) -> None:
    grown = footprint_growth(before, after)
    assert not grown, "state kept for objects that are gone (path: before, after):\n" + "\n".join(
        f"  {path}: {counts[0]} -> {counts[1]}" for path, counts in grown.items()
    )


@contextlib.asynccontextmanager
async def churning(
    kube: KubeClient,
    namespace: str,
    controller_factory: ControllerFactory,
    claims_per_pool: int = 2,
    repair: RepairSettings = REPAIR,
    same_names: bool = False,
) -> AsyncIterator[Churn]:
    async with controller_factory(namespaces=[namespace], repair=repair) as controller:
        churn = Churn(kube, namespace, controller, claims_per_pool, same_names)
        try:
            yield churn
        finally:
            await churn.remove_cluster_scoped()


async def test_pool_churn_leaves_nothing_behind(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    async with churning(kube, namespace, controller_factory) as churn:
        await churn.pool_cycle()  # warm-up: lazily made state (metric children, module caches) exists from here
        before = footprint(churn.controller)
        for _ in range(2):
            await churn.pool_cycle()
        assert_nothing_grew(before, footprint(churn.controller))


async def test_pool_churn_under_the_same_names_leaves_nothing_behind(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    # Pools and claims re-created under the names just deleted: forgetting races the uid and tombstone checks.
    async with churning(kube, namespace, controller_factory, same_names=True) as churn:
        await churn.pool_cycle()
        before = footprint(churn.controller)
        for _ in range(3):
            await churn.pool_cycle()
        assert_nothing_grew(before, footprint(churn.controller))


async def test_claim_churn_in_pools_that_stay_leaves_nothing_behind(
    kube: KubeClient, namespace: str, controller_factory: ControllerFactory
) -> None:
    # The repair loop runs too: its passes race the claims' releases, and must not keep anything per churned claim.
    async with churning(kube, namespace, controller_factory) as churn:
        await churn.create_pools()
        await churn.churn_claims("w")
        await churn.settle()
        before = footprint(churn.controller)
        for cycle in range(3):
            await churn.churn_claims(str(cycle))
            await churn.settle()
        assert_nothing_grew(before, footprint(churn.controller))
        await churn.delete_pools()


# Each cleanup the components rely on, and the path that grows without it.
CLEANUPS = [
    pytest.param(Store, "forget_tombstone", "caches.claims._tombstones", id="store-tombstones"),
    pytest.param(EventCorrelator, "forget", "correlator._series._entries", id="event-correlator"),
    pytest.param(Ledger, "forget", "ledger._indexes", id="ledger-indexes"),
    pytest.param(ReservationClient, "forget", "ledger.reservations._domains", id="ledger-domains"),
    pytest.param(Coverage, "remove", "survey._coverage[*]._segments", id="overlap-index"),
    pytest.param(InClusterBackend, "forget_pool", "._parsed", id="backend-parses"),
    pytest.param(InClusterBackend, "forget_pool", "all_inside", id="backend-all-inside"),
    pytest.param(PoolRepairs, "_forget", "repair", id="repair-per-pool"),
    pytest.param(EventRecorder, "forget", "correlator._series._entries", id="controller-recorder-forget"),
]


@pytest.mark.parametrize(("owner", "cleanup", "path"), CLEANUPS)
async def test_without_one_cleanup_its_state_grows(
    kube: KubeClient,
    namespace: str,
    controller_factory: ControllerFactory,
    monkeypatch: pytest.MonkeyPatch,
    owner: type,
    cleanup: str,
    path: str,
) -> None:
    monkeypatch.setattr(owner, cleanup, lambda *_, **__: None)
    async with churning(kube, namespace, controller_factory, claims_per_pool=1) as churn:
        before = footprint(churn.controller)  # no warm-up: the path checked holds per-object state only
        await churn.create_pools()
        await churn.churn_claims(str(churn.cycle))
        await churn.repair_pass()  # what the repair loop keeps per pool exists before the pools go
        await churn.delete_pools()
        await churn.settle()
        grown = footprint_growth(before, footprint(churn.controller))
    assert any(path in grown_path for grown_path in grown), f"{path} did not grow; what grew: {grown}"


@pytest.mark.parametrize("forgets", [True, False], ids=["forgotten", "without-context-forget"])
async def test_a_status_refusal_is_forgotten_with_its_pool(
    kube: KubeClient,
    namespace: str,
    controller_factory: ControllerFactory,
    monkeypatch: pytest.MonkeyPatch,
    forgets: bool,
) -> None:
    # The API server refusing every pool status (422) notes a refusal per pool (`ReconcileContext._refused`).
    async def refusing(
        kube: KubeClient, store: Store, resource: Resource, obj: Object, patch: Object, **kw: Any
    ) -> Object:
        if kw.get("subresource") == "status" and resource.kind != CLAIMS.kind:
            raise ApiError(422, "Invalid", "status refused by the test")
        return await patch_cached(kube, store, resource, obj, patch, **kw)

    monkeypatch.setattr(context, "patch_cached", refusing)  # what `ReconcileContext.write_status` calls
    if not forgets:
        monkeypatch.setattr(ReconcileContext, "forget", lambda *_, **__: None)
    async with churning(kube, namespace, controller_factory, claims_per_pool=1) as churn:
        before = footprint(churn.controller)
        await churn.pool_cycle()
        grown = footprint_growth(before, footprint(churn.controller))
    refused = [path for path in grown if "_refused" in path]
    assert bool(refused) is not forgets, f"what grew: {grown}"
