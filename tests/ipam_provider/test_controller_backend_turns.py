"""Backend calls for one pool: serialised for a backend that does not declare `concurrent_claims`, concurrent for
one that does; calls for different pools always run at once. The work queue gives such a pool one worker at a
time."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from ipam_provider.api.capi import CLAIMS
from ipam_provider.backend.contract import Allocation, ClaimContext, PoolKind, PoolRef
from ipam_provider.backend.registry import BackendRegistry
from ipam_provider.common import Object
from ipam_provider.controller import Controller, ControllerSettings
from ipam_provider.runtime.kube.client import KubeClient
from tests.support.fake_backend import FakeBackend
from tests.support.world import NS, POOLS, claim, make_world, pool

YIELDS = 20  # each allocate hands the loop over this many times while it is "in the backend"


@dataclass
class OverlapBackend(FakeBackend):
    """A fake backend that stays inside `allocate` for a while and records how many calls per pool overlap."""

    active: dict[PoolRef, int] = field(default_factory=dict)
    most: dict[PoolRef, int] = field(default_factory=dict)
    most_overall: int = 0

    async def allocate(
        self, pool_ref: PoolRef, pool: Object, claim: ClaimContext, existing: Allocation | None = None
    ) -> Allocation:
        self.active[pool_ref] = self.active.get(pool_ref, 0) + 1
        self.most[pool_ref] = max(self.most.get(pool_ref, 0), self.active[pool_ref])
        self.most_overall = max(self.most_overall, sum(self.active.values()))
        try:
            for _ in range(YIELDS):
                await asyncio.sleep(0)
            return await super().allocate(pool_ref, pool, claim, existing)
        finally:
            self.active[pool_ref] -= 1


@dataclass
class ConcurrentOverlapBackend(OverlapBackend):
    concurrent_claims: bool = True
    kinds_served: Sequence[PoolKind] = ()

    @property
    def kinds(self) -> Sequence[PoolKind]:
        return self.kinds_served or super().kinds


async def reconcile_all(backend: OverlapBackend, pools: Sequence[str], per_pool: int) -> dict[str, int]:
    world = make_world(backend)
    names = []
    for pool_name in pools:
        world.add(POOLS, pool(pool_name))
        for index in range(per_pool):
            names.append(f"{pool_name}-{index}")
            world.add(CLAIMS, claim(names[-1], pool_name))
    await asyncio.gather(*(world.claims.reconcile(NS, name) for name in names))
    assert all(world.claim(name)["status"]["addressRef"] == {"name": name} for name in names)
    return {ref.name: most for ref, most in backend.most.items()}


async def test_a_backend_without_the_capability_gets_one_call_per_pool_at_a_time() -> None:
    backend = OverlapBackend()
    assert not BackendRegistry([backend]).capabilities(backend).concurrent_claims
    assert await reconcile_all(backend, ["a", "b"], 3) == {"a": 1, "b": 1}
    assert backend.most_overall == 2, "the two pools are served at once"


async def test_a_concurrent_backend_gets_the_claims_of_one_pool_at_once() -> None:
    backend = ConcurrentOverlapBackend()
    assert BackendRegistry([backend]).capabilities(backend).concurrent_claims
    assert await reconcile_all(backend, ["a", "b"], 3) == {"a": 3, "b": 3}


async def test_only_a_true_attribute_declares_the_capability() -> None:
    backend = FakeBackend()
    backend.concurrent_claims = "yes"  # type: ignore[assignment]
    assert not BackendRegistry([backend]).capabilities(backend).concurrent_claims


async def test_the_queue_runs_one_key_at_a_time_for_a_pool_whose_backend_is_not_concurrent() -> None:
    serial, concurrent = OverlapBackend(), ConcurrentOverlapBackend()
    serial_kind = serial.kinds[0]
    concurrent_kind = dataclasses.replace(serial_kind, group="concurrent.example.com")
    concurrent.kinds_served = [concurrent_kind]
    controller = Controller(cast(KubeClient, object()), BackendRegistry([serial, concurrent]), ControllerSettings())
    assert controller._shard_limit(serial_kind.ref(NS, "p")) == 1
    assert controller._shard_limit(concurrent_kind.ref(NS, "p")) is None
    assert controller._shard_limit(None) is None
